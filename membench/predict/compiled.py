"""torch.compile said plainly. A model the user's code compiles: a prediction runs it under dispatch modes (fake
tensors, the storage tracker), under which Dynamo runs a compiled forward eager, so it is predicted as its eager self
and the prediction names that answer (in its output, on a line of its own, and in the record's `assumed`).

The compile technique (techniques/compile.py) is predicted compiled instead: `Partitioned` compiles the fake model
with AOTAutograd as Inductor would partition it and runs the graphs op by op (docs/compile.md), and says what that
approximates (APPROXIMATED)."""

from __future__ import annotations

import torch
from torch import nn

from membench import private
from membench.results import Compiled, SavedTensor
from membench.techniques import Technique

PREFIX = "torch.compile:"  # how the CLI tells this answer from the others (a line of its own)


def note(model: nn.Module) -> str | None:
    """One line naming what is compiled and that it was predicted eager; None where nothing is."""
    names = private.compiled_modules(model)
    if not names:
        return None
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    which = "the model's forward is" if names == [""] else f"the forward of module {shown} is" if len(names) == 1 \
        else f"the forwards of modules {shown} are"
    return (f"{PREFIX} {which} compiled and predicted eager (under a dispatch mode Dynamo runs it eager): a compiled "
            "step can keep other intermediates (Inductor fuses ops), so its memory can differ")


# --- the compile technique, predicted (techniques/compile.py) ----------------------------------------------------
APPROXIMATED = (f"{PREFIX} predicted from the graphs AOTAutograd makes for Inductor (Inductor's decompositions, "
                "joint-graph passes and partitioner: what the forward saves for backward is the compiled step's), "
                "run op by op on fake tensors: Inductor's fusion, buffer reuse, post-grad passes and "
                "channels-last layout for convolutions are not followed, so intermediates a fused kernel never "
                "materialises are counted as tensors of their own")


class Partitioned(Technique):
    """Stands for the compile technique in a prediction: the model compiled with a backend that partitions as
    Inductor does and runs the graphs op by op (private.partitioning_backend), so the prediction's storage tracker,
    CUDA emulation and allocator simulator see the compiled step's saved set. `saved` keeps what the partitioner
    chose to save for backward."""

    name = "compile"
    summary = "torch.compile, predicted from AOTAutograd's partition"
    compiles = True

    def __init__(self, inner: Technique):
        super().__init__(inner.spec)
        self.inner = inner
        self.order = inner.order
        self.saved: list[SavedTensor] = []

    def configure(self, state) -> None:
        private.dynamo_reset()
        state.model.compile(backend=private.partitioning_backend(self._saved))

    def _saved(self, values) -> None:
        self.saved = [SavedTensor(name=name, shape=[int(n) for n in value.shape], dtype=str(value.dtype).removeprefix(
            "torch."), bytes=int(value.numel()) * value.element_size()) for name, value in values
            if isinstance(value, torch.Tensor)]


def compiled_record(spec, saved: list[SavedTensor]) -> Compiled:
    """A compiled prediction's record: the partitioner's saved tensors and what was approximated."""
    return Compiled(mode=spec.compile_mode, options=spec.compile_options, saved=saved, approximated=APPROXIMATED)
