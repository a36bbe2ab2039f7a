"""Knowing when a checkpointed block's forward runs again in backward (recomputation), so that the memory it
allocates is counted as recomputed activations, not as backward's temporaries.

torch.utils.checkpoint calls the block's forward a second time from inside backward; the technique wraps that
forward with `marked`, and the wrapper tells the second call (inside autograd's backward) from the first.
"""

from __future__ import annotations

import functools
import threading

import torch

from membench.private import in_backward

_state = threading.local()


def active() -> bool:
    """True while a checkpointed forward is being recomputed (on this thread)."""
    return getattr(_state, "depth", 0) > 0


def marked(forward):
    """`forward`, marking its calls that run inside backward as recomputation."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        # Traced by Dynamo (a compiled model's checkpointed block): AOTAutograd's partitioner decides what is
        # recomputed, inside the compiled backward, where no mark can reach.
        if torch.compiler.is_compiling() or not in_backward():
            return forward(*args, **kwargs)
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return forward(*args, **kwargs)
        finally:
            _state.depth -= 1

    return run
