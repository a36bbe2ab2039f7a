from membench.techniques.base import Technique


class Baseline(Technique):
    """The workload as written: one batch, one backward, one optimizer step. Everything is compared to it."""

    name = "baseline"
    summary = "the workload as written; every other run is compared to it"
