"""torch.compile said plainly: a prediction runs the model under dispatch modes (fake tensors, the storage tracker),
and under any dispatch mode Dynamo runs a compiled forward eager, so a compiled model is predicted as its eager
self. The prediction names that answer (in its output, on a line of its own, and in the record's `assumed`)."""

from __future__ import annotations

from torch import nn

from membench import private

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
