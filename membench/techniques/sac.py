import functools

from membench.techniques.ckpt import ActivationCheckpointing


def _policy(saved: set, ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE


class SelectiveCheckpointing(ActivationCheckpointing):
    """Trades a little compute for part of the activation memory: inside each block, outputs of matmuls and
    attention are kept and everything cheap (norms, activations, dropout, adds) is recomputed in backward
    (torch.utils.checkpoint's selective policy). Memory between the baseline and ckpt, at a fraction of ckpt's
    recompute. The numbers are bit-for-bit the baseline's. Conflicts with ckpt: both checkpoint the same blocks.
    """

    name = "sac"
    summary = "selective checkpointing: keep matmul/attention outputs, recompute the cheap ops in backward"
    cost = "low"
    min_torch = "2.5"
    min_torch_for = "torch.utils.checkpoint.create_selective_checkpoint_contexts"
    conflicts = ("ckpt",)
    conflict_reason = "both checkpoint the same blocks: choose one"
    order = 30

    def checkpoint_options(self) -> dict:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        from membench.private import attention_and_matmul_ops

        # Expensive to recompute, and their outputs are what the rest of the block is computed from: keep them.
        policy = functools.partial(_policy, attention_and_matmul_ops())
        return {"context_fn": functools.partial(create_selective_checkpoint_contexts, policy)}
