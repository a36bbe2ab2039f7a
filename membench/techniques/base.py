"""The technique plug-in interface: a handful of hooks that default to doing nothing.

A technique changes how the training state is set up (`configure`), never the training loop itself. Stacked
techniques ("ckpt+opt-in-bwd") configure the same `TrainState` one after another, in `order`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from membench.common.vocab import COSTS, Cost  # noqa: F401 - COSTS re-exported: the registry's vocabulary

if TYPE_CHECKING:  # a technique module imports torch where a hook runs: the registry is read without it
    from torch import nn

    from membench.spec import RunSpec
    from membench.step import TrainState
    from membench.workloads import Workload



class Technique:
    """Base class. Subclasses set the class attributes and override only the hooks they need.

    name: what the user types; summary: the one-line trade-off (what it saves, what it costs).
    requires / conflicts: other technique names this one needs, or cannot be stacked with (conflicts are
    symmetric: declaring one side is enough); conflict_reason: why, in one sentence, for the refusal message.
    numerics: "exact" (must train bit-for-bit the same model), "rounding" (same formula, another order of float
    operations: same up to last-bit rounding after one step), "batch-split" (same up to fp rounding of sums),
    or "precision" (changes the numbers on purpose; the loss difference is reported).
    devices: where it means something. distributed: run through torchrun.
    param_dtype: the name of the torch dtype it trains the parameters in ("bfloat16"; None: fp32);
    init-on-device builds at it.
    same_init: False if the initial values may differ from the baseline's draw (the equivalence check then
    starts both runs from the baseline's initial values).
    env: environment variables for the run's own process only.
    predictable: False if it moves memory between host and device, which a prediction on CPU cannot tell apart.
    recomputes_forward: True if it runs (part of) the forward again in backward: modules with state updated in
    forward (BatchNorm's running statistics) are updated again, which the equivalence verdict explains.
    trains: what it trains instead of the baseline's model, in a few words ("an adapter"; "": the same model):
    the equivalence verdict and the fits line say it.
    order: when `configure` runs relative to the others in a stack (small first).
    options: the RunSpec fields only this technique reads (accum's --accum-steps): a run without the technique
    does not depend on them, so check, compare and --resume pair it whatever their value (techniques.pairing_key).
    min_torch: the oldest torch release ("2.9") that has what it uses, named in min_torch_for; None: any that
    membench runs on. An older torch refuses it in one line before anything runs. min_torch_predicted: the same
    for a prediction of it, where that needs more (FSDP2 on fake tensors).
    cost: what it costs in step time, as its summary says, in four classes (COSTS, cheapest first): "none" (as
    fast or faster: a fused step, 16-bit matmuls, an allocator setting), "low" (more, smaller kernels or overlapped
    communication), "medium" (compute again or in smaller pieces: checkpointing, accumulation), "high" (host
    memory traffic every step: offloading). A prediction has no timing: this is how it names the cheapest
    technique that fits (predict.verdict), never a measured figure.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    conflicts: ClassVar[tuple[str, ...]] = ()
    conflict_reason: ClassVar[str] = ""
    numerics: ClassVar[str] = "exact"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    distributed: ClassVar[bool] = False
    env: ClassVar[dict[str, str]] = {}
    order: ClassVar[int] = 50
    param_dtype: ClassVar[str | None] = None
    same_init: ClassVar[bool] = True
    predictable: ClassVar[bool] = True
    recomputes_forward: ClassVar[bool] = False
    trains: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    cost: ClassVar[Cost] = "none"
    min_torch: ClassVar[str | None] = None
    min_torch_for: ClassVar[str] = ""
    min_torch_predicted: ClassVar[str | None] = None
    min_torch_predicted_for: ClassVar[str] = ""
    compiles: ClassVar[bool] = False  # torch.compile's the model: the CPU tracker lets compiled code run compiled

    def __init__(self, spec: RunSpec, stack_param_dtype: str | None = None):
        self.spec = spec
        self.stack_param_dtype = stack_param_dtype  # the dtype the whole stack trains in, by name (None: fp32)

    def validate(self, spec: RunSpec, workload: Workload) -> None:
        """Raise UserError if this technique cannot run with this spec or workload."""

    def build_model(self, build: Callable[[], nn.Module], device: str) -> nn.Module | None:
        """Build the model another way (another device or dtype); None keeps the default (build, then .to)."""
        return None

    def configure(self, state: TrainState) -> None:
        """Change the training state: wrap the model, split the batch, choose or replace the optimizer."""
