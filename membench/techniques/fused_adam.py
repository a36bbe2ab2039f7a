from membench.techniques.base import Technique


class FusedAdam(Technique):
    """Trades bit-for-bit reproducibility with the default step for speed and memory: the optimizer (Adam, or
    SGD with --optimizer sgd) with fused=True updates all parameters in one kernel per group with no
    intermediates. Same formula, different order of float operations: expect rounding-level differences.

    Runs on CPU and CUDA (torch >= 2.4). Conflicts with foreach-off: both choose the step's implementation.
    Stacks with opt-in-bwd (a fused step per parameter).
    """

    name = "fused-adam"
    summary = "optimizer with fused=True: one kernel per step, no intermediates; rounding-level differences"
    conflicts = ("foreach-off",)
    conflict_reason = "both choose the optimizer step's implementation: one per run"
    order = 15
    numerics = "rounding"

    def validate(self, spec, workload) -> None:
        from membench import optimizers
        from membench.common.errors import UserError

        if not optimizers.supports(spec.optimizer, "fused"):
            raise UserError(f"technique {self.name} needs an optimizer with a fused step (adam, adamw, sgd, "
                            f"sgd-momentum); {spec.optimizer} has none")

    def configure(self, state) -> None:
        state.optimizer_options["fused"] = True
        # A CUDA prediction asks for foreach, CUDA's default (predict._Prepared); torch refuses both at once.
        state.optimizer_options.pop("foreach", None)
