from membench.techniques.base import Technique


class ForeachOff(Technique):
    """Trades optimizer-step speed for memory: Adam with foreach=False updates one parameter at a time instead
    of launching multi-tensor kernels over all of them, so the step needs no full-size intermediates
    (the tutorial's ~1.2 GB on vit_l_16), at the cost of many small kernel launches.

    On CPU torch already defaults to foreach=False, so there it matches the baseline.
    """

    name = "foreach-off"
    summary = "optimizer with foreach=False: no multi-tensor intermediates at the step, slower step on GPU"
    cost = "low"
    conflicts = ("fused-adam",)  # both choose the optimizer's implementation: one per run
    conflict_reason = "both choose the optimizer step's implementation: one per run"
    order = 15

    def configure(self, state) -> None:
        state.optimizer_options["foreach"] = False
