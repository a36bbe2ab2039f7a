from membench.common.errors import UserError
from membench.techniques.base import Technique


class GradientAccumulation(Technique):
    """Trades time for activation memory: N micro-batches of B/N each, loss scaled by 1/N, one optimizer step.

    Same effective batch; the same gradients up to fp32 rounding, unless the model normalises over the batch
    (BatchNorm), where each micro-batch sees its own statistics and the result is a different model.
    """

    name = "accum"
    summary = "split the batch into --accum-steps micro-batches: less activation memory, lower throughput"
    cost = "medium"
    numerics = "batch-split"
    order = 20
    options = ("accum_steps",)

    def validate(self, spec, workload) -> None:
        if spec.batch_size % spec.accum_steps:
            raise UserError(f"--batch-size {spec.batch_size} is not divisible by --accum-steps {spec.accum_steps}"
                            " (accumulation needs equal micro-batches)")

    def configure(self, state) -> None:
        state.micro_batches = self.spec.accum_steps
