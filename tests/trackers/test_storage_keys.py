"""The storage tracker's keys (trackers/storage.py, _StorageKeys): a storage is known by identity until it is freed,
then its key is reported freed once, and its entry is gone before another storage can take its id."""

from __future__ import annotations

import gc

import torch

from membench.trackers.storage import NOT_COUNTED, StorageTracker, _StorageKeys


def test_a_storage_is_known_until_freed_then_reported_once():
    freed = []
    keys = _StorageKeys(freed.append)
    a, b, excluded = torch.empty(4), torch.empty(4), torch.empty(4)
    keys[a.untyped_storage()] = 0
    keys[b.untyped_storage()] = 1
    keys[excluded.untyped_storage()] = NOT_COUNTED
    view = a[1:]  # another tensor on the same storage: the same key
    assert (keys.get(view.untyped_storage()), keys.get(b.untyped_storage())) == (0, 1)
    assert keys.get(torch.empty(4).untyped_storage()) is None and b.untyped_storage() in keys
    del a
    assert freed == [] and keys.get(view.untyped_storage()) == 0  # the view holds the storage
    del view, excluded
    gc.collect()
    assert freed == [0]  # an excluded storage is not reported
    for _ in range(100):  # new storages (some at freed ids) are not known
        assert keys.get(torch.empty(4).untyped_storage()) is None
    del b
    assert freed == [0, 1] and len(keys._held) == 0


def test_a_tracker_sees_each_storage_freed_in_the_order_they_go():
    with StorageTracker(trace=True) as tracker:
        x = torch.empty(16)
        y = x * 2
        z = y + 1
        del y
        w = [torch.empty(8) for _ in range(3)]
        del w, x, z  # a list lets go of its items last first
    frees = [e.key for e in tracker.trace if e.kind == "free"]
    assert frees == [1, 5, 4, 3, 0, 2] and tracker.current == 0 and tracker.live == {}
