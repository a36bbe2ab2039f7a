import functools

from membench.common.errors import UserError
from membench.techniques.base import Technique


class ActivationCheckpointing(Technique):
    """Trades compute for activation memory: each block keeps only its input; backward recomputes the rest.

    Non-reentrant checkpointing per transformer block; the numbers are bit-for-bit those of the baseline.
    """

    name = "ckpt"
    summary = "recompute each block's activations in backward: less activation memory, ~1/3 more compute"
    cost = "medium"
    order = 30
    recomputes_forward = True

    def validate(self, spec, workload) -> None:
        if workload.blocks is None:
            raise UserError(f"technique {self.name} needs blocks to checkpoint, and workload {spec.workload!r} "
                            "declares none (Workload.blocks)")

    def checkpoint_options(self) -> dict:
        """Extra torch.utils.checkpoint arguments (selective checkpointing passes its policy here)."""
        return {}

    def configure(self, state) -> None:
        from torch.utils.checkpoint import checkpoint

        from membench.trackers.recompute import marked

        options = self.checkpoint_options()
        for block in state.workload.blocks(state.model):
            # marked: the memory trackers count what the forward allocates again in backward as recomputed
            # activations (it costs nothing when no tracker is on).
            block.forward = functools.partial(checkpoint, marked(block.forward), use_reentrant=False, **options)
