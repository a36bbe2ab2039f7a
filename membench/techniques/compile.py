"""torch.compile on the model: Dynamo captures the forward, AOTAutograd's partitioner decides what the forward saves
for backward, Inductor fuses the ops into kernels and plans its buffers' reuse. The compiled step can hold less
memory (intermediates fused away) or more (the partitioner saves other tensors); a run measures which.

Compiling happens in the first warm-up step (and a backward's in its first backward); the measured steps run the
compiled code (on CPU the storage tracker lets it: trackers/compiled.py), and the record keeps the compile time,
graph breaks and recompiles apart (results.Compiled).
"""

from __future__ import annotations

import ast

from membench.common.errors import UserError
from membench.techniques.base import Technique

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def parse_options(text: str | None) -> dict:
    """--compile-options 'key=value,...' -> Inductor's options (values as Python literals: True, 8, 'name'; a word
    that is not one is a string)."""
    if not text:
        return {}
    options = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise UserError(f"--compile-options takes key=value pairs separated by commas (e.g. "
                            f"epilogue_fusion=False,max_autotune=True), got {item.strip()!r}")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return options


class Compile(Technique):
    """torch.compile (Inductor) on the model. Inside a compiled region the storage tracker counts Inductor's
    buffers but no module runs (module hooks are traced away), so its memory belongs to the module that called it;
    a checkpointed block's recomputation happens inside the compiled backward and counts as backward's."""

    name = "compile"
    summary = ("torch.compile the model: fused kernels keep fewer intermediates, the partitioner re-decides what "
               "forward saves; compiling costs warm-up time")
    # Fused kernels sum in another order than eager's (a bias's gradient over the batch): checked as a split batch is,
    # with SGD, since Adam's first step turns rounding noise in near-zero gradients into full-size updates.
    numerics = "batch-split"
    cost = "none"
    order = 90  # last: it compiles the model as the other techniques left it (checkpointed blocks included)
    options = ("compile_mode", "compile_options")
    compiles = True
    conflicts = ("fsdp", "fsdp-offload", "tp", "act-offload", "opt-offload")
    conflict_reason = ("membench compiles single-device stacks only (sharded and offloaded steps are not measured "
                       "compiled here)")

    def validate(self, spec, workload) -> None:
        if spec.compile_mode not in MODES:
            raise UserError(f"unknown --compile-mode {spec.compile_mode!r}; valid: {', '.join(MODES)}")
        options = parse_options(spec.compile_options)
        if options:
            from membench.private import inductor_option_names

            unknown = sorted(set(options) - inductor_option_names())
            if unknown:
                raise UserError(f"--compile-options: {', '.join(map(repr, unknown))} is not an option of Inductor "
                                "(torch._inductor.list_options() names them)")

    def compile_arguments(self) -> dict:
        """torch.compile's keywords: the mode, or (with options) the mode's options updated by the user's, since
        torch.compile refuses a mode and options together."""
        options = parse_options(self.spec.compile_options)
        if not options:
            return {"mode": self.spec.compile_mode}
        from membench.private import mode_options

        return {"options": {**mode_options(self.spec.compile_mode), **options}}

    def configure(self, state) -> None:
        # In place (Module.compile): the parameters keep their names, which the equivalence check compares.
        state.model.compile(**self.compile_arguments())
