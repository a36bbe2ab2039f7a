"""A real run's tensors are never fake: transformers' `is_tracing(tensor)` (utils/import_utils.py) counts a
FakeTensor as tracing (`is_fake_tensor`), and then takes the paths it keeps for torch.export and compile, which a
run on real tensors never takes. The one that moves memory: masking_utils' `find_packed_sequence_indices` keeps its
packed-sequence tensor instead of reading that there is one sequence per row, so `create_causal_mask` builds the
full [batch, 1, q, kv] boolean mask instead of leaving SDPA `is_causal=True`; SDPA then converts the mask to a float
bias per layer, which memory-efficient attention keeps for backward (batch x q x kv elements a layer). While a
prediction runs, transformers sees no fake tensor, so it reads values where a run reads them
(predict/emulate/values.py answers those reads, and names them)."""

from __future__ import annotations

import contextlib
import sys

MODULE = "transformers.utils.import_utils"  # where is_fake_tensor is defined and is_tracing looks it up


def _not_fake(x) -> bool:
    return False


@contextlib.contextmanager
def real_to_transformers():
    """Inside: transformers' is_fake_tensor answers False (where transformers is imported: a workload that uses it
    has imported it by the time its model is built, before any fake tensor exists)."""
    module = sys.modules.get(MODULE)
    original = getattr(module, "is_fake_tensor", None)
    if original is None:
        yield
        return
    module.is_fake_tensor = _not_fake
    try:
        yield
    finally:
        module.is_fake_tensor = original
