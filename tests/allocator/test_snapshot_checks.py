"""A snapshot whose layout cannot be real, or whose recorded settings are junk, is one clear refusal: the replay
would otherwise simulate memory that never existed."""

import pickle

import pytest

from membench.allocator.settings import parse_alloc_conf
from membench.allocator.snapshot import initial_state
from membench.common.errors import UserError
from tests.allocator.test_simulator import S1, MiB, hand_made_snapshot, run_cli


def _blocks(snap):
    return snap["segments"][0]["blocks"]


CASES = [
    ("a block bigger than its segment", lambda s: _blocks(s)[1].update(size=30 * MiB),
     r"the block at 0x7f0000400000 \(31457280 bytes\) ends past its segment at 0x7f0000000000 \(20971520 bytes\)"),
    ("the last block one byte past the end", lambda s: _blocks(s)[2].update(size=8 * MiB + 1), "ends past its segment"),
    ("overlapping blocks", lambda s: _blocks(s)[1].update(address=S1 + 2 * MiB),
     "the block at 0x7f0000200000 overlaps the one before it in the segment at 0x7f0000000000"),
    ("a negative block size", lambda s: _blocks(s)[1].update(size=-8 * MiB), "positive 'size'"),
    ("a zero block size", lambda s: _blocks(s)[2].update(size=0), "positive 'size'"),
    ("a block address not a number", lambda s: _blocks(s)[1].update(address="x"), "integer 'address'"),
    ("a negative segment size", lambda s: s["segments"][0].update(total_size=-20 * MiB), "positive 'total_size'"),
    ("a negative event size", lambda s: s["device_traces"][0][0].update(size=-1), "negative 'addr' or 'size'"),
    ("a junk collection threshold",
     lambda s: s.update(allocator_settings={"garbage_collection_threshold": "x"}), "garbage_collection_threshold 'x'"),
    ("an infinite collection threshold",
     lambda s: s.update(allocator_settings={"garbage_collection_threshold": float("inf")}), "threshold 'inf'"),
    ("junk divisions", lambda s: s.update(allocator_settings={"roundup_power2_divisions": {"1": "x"}}),
     "roundup_power2_divisions"),
    ("a 5,000-digit recorded setting",
     lambda s: s.update(allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:" + "9" * 5000}),
     "max_split_size_mb is a number of 5000 digits: at most 18"),
]


@pytest.mark.parametrize("what,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_an_impossible_snapshot_is_refused(what, mutate, message):
    snap = hand_made_snapshot()
    mutate(snap)
    with pytest.raises(UserError, match=message) as info:
        initial_state(snap)
    assert len(str(info.value)) < 600 and "\n" not in str(info.value)


def test_the_untouched_snapshot_still_rebuilds():
    # the checks above must not refuse what is real: blocks that exactly tile their segment
    assert initial_state(hand_made_snapshot()).segments[0].allocated == [(S1, 4 * MiB, 4 * MiB)]


@pytest.mark.parametrize("text", ["max_split_size_mb:" + "9" * 5000, "roundup_power2_divisions:" + "9" * 5000,
                                  "garbage_collection_threshold:0." + "9" * 5000])
def test_a_5000_digit_alloc_conf_is_one_bounded_line(text):
    with pytest.raises(UserError) as info:
        parse_alloc_conf(text)
    assert len(str(info.value)) < 600


def test_replay_cli_refuses_a_5000_digit_alloc_conf(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(hand_made_snapshot()))
    proc = run_cli(path, "--alloc-conf", "max_split_size_mb:" + "9" * 5000)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "at most 18" in proc.stderr


def test_replay_cli_refuses_an_empty_capacity(tmp_path):
    # '' used to mean "unlimited" silently
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(hand_made_snapshot()))
    proc = run_cli(path, "--capacity", "")
    assert proc.returncode == 2 and "argument --capacity: cannot read '' as a size" in proc.stderr
