"""Numbers and paths past what a run can take are usage errors (one line, exit 2), not a run recorded as failed."""

import pytest

from tests.helpers import probe_in_process
from tests.test_cli import one_line_and_exit_2

RUN = ["run", "--workload", "vit-tiny", "--techniques", "baseline", "--device", "cpu"]

CASES = [
    (RUN + ["--batch-size", str(10**23)], "--batch-size must be an integer from 1 to 2147483647, got 1000"),
    (RUN + ["--batch-size", "9" * 5000], "' is not an integer"),
    (RUN + ["--seed", str(2**70)], "--seed must be an integer from 0 to 4294967295, got 1180591620717411303424"),
    (RUN + ["--seed", str(10**60)], "from 0 to 4294967295, got an integer of about 60 digits"),
    (RUN + ["--seed", "-1"], "--seed must be an integer from 0 to 4294967295, got -1"),
    (RUN + ["--out", ""], "argument --out: an empty path names no file or folder"),
    (RUN + ["--out", "  "], "argument --out: an empty path names no file or folder"),
    (RUN + ["--memory-budget", ""], "argument --memory-budget: cannot read '' as a size"),
    (["report", ""], "argument results: an empty path names no file or folder"),
]


@pytest.mark.parametrize("args,message", CASES)
def test_out_of_range_is_a_usage_error(monkeypatch, args, message):
    with probe_in_process(monkeypatch):
        one_line_and_exit_2(args, message)


def test_the_largest_valid_values_pass_validation():
    from membench.spec import MAX_COUNT, MAX_SEED, RunSpec

    spec = RunSpec(workload="vit-tiny", techniques=("baseline",), batch_size=MAX_COUNT, device="cpu",
                   seed=MAX_SEED, accum_steps=1)
    assert spec.validated().seed == 2**32 - 1


def test_a_whole_number_of_bytes_is_read_exactly():
    from membench.common.units import parse_bytes

    # Through a float these read as 2**63 and 2**53: a valid --memory-budget would then be refused or moved.
    assert parse_bytes("9223372036854775807") == 2**63 - 1
    assert parse_bytes("9007199254740993B") == 2**53 + 1
    assert parse_bytes("1.5GiB") == 3 * 2**29
