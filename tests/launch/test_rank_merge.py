"""One rank's failure: every rank's record, no hang; the run's record made from its ranks' records."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from membench.launch import distributed
from membench.results import Environment, RunRecord, read_result, write_record
from tests.helpers import spec


# --- 5. one rank's failure: every rank's record, no hang ---------------------------------------------------------
def _record(status: str, error: str | None = None, peak: int | None = None) -> RunRecord:
    from membench.results import Memory

    memory = Memory(device="cpu", method="storage-tracker", peak_allocated_bytes=peak,
                    peak_phase="forward", peak_step=1) if peak else None
    return RunRecord(name="fsdp", status=status, spec=spec("gpt-tiny", ("fsdp",)), env=Environment(device="cpu"),
                     error=error, memory=memory)


def test_the_runs_record_is_made_from_its_ranks_records(tmp_path):
    out = tmp_path / "fsdp.json"
    write_record(out, _record("error", "DistBackendError during measure: Connection closed by peer"))
    write_record(distributed.rank_record_path(out, 1), _record("oom", "out of memory during measure: planted",
                                                               peak=1000))
    merged = distributed.merge_ranks(out, since=0)
    assert merged.status == "oom"
    assert merged.error == ("rank 1: out of memory during measure: planted; "
                            "rank 0: DistBackendError during measure: Connection closed by peer")
    assert merged.memory.peak_allocated_bytes == 1000
    # Rank 0 stopped by torchrun (no record of its own): the failed rank's record is the run's.
    out.unlink()
    merged = distributed.merge_ranks(out, since=0)
    assert merged.status == "oom" and "rank 0 left no record" in merged.error
    # Every rank ok: rank 0's record stands as it is.
    write_record(out, _record("ok"))
    write_record(distributed.rank_record_path(out, 1), _record("ok"))
    assert distributed.merge_ranks(out, since=0) is None
    assert not list(tmp_path.glob("*.rank*"))  # rank records stay out of the results folder's top level


def test_agree_in_one_process_raises_the_error_itself():
    distributed.agree(None, "the reference pass")
    with pytest.raises(torch.OutOfMemoryError):
        distributed.agree(torch.OutOfMemoryError("planted"), "the reference pass")


def test_an_oom_on_one_rank_ends_the_run_as_oom_with_every_ranks_record(tmp_path):
    """torchrun, 2 ranks, gloo: rank 1 runs out of memory inside a step while rank 0 waits in that step's
    collectives. Before: rank 1 exited cleanly without a record and rank 0 waited (up to the group's timeout)."""
    from membench.launch.process import launch
    from membench.spec import LaunchSpec

    job = dataclasses.replace(spec("tests.workloads:oom_on_rank1", ("fsdp",), batch_size=8, nproc_per_node=2),
                              launch=LaunchSpec(timeout_s=300))  # a hang would end as status "timeout"
    record = launch(job, tmp_path)  # the fsdp run alone, through torchrun, as the sweep launches it
    assert record.status == "oom", (record.status, record.error, record.log_tail)
    assert record.error.startswith("rank 1: out of memory during measure: planted")
    assert record.memory is not None and record.memory.peak_allocated_bytes > 0
    assert read_result(tmp_path / "fsdp.json").status == "oom"
    assert read_result(tmp_path / "runs" / "fsdp.rank1.json").status == "oom"
