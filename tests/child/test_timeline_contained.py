"""The recording pass is contained: it is the one stage that uses the allocator's labelled history (private.py,
a path a new torch release may change), so an exception there is a note on the run, and the timing, the
prediction and the equivalence verdict measured around it are kept."""

from __future__ import annotations

from membench.child import worker
from membench.report.live import run_line
from membench.results import read_result
from membench.trackers import timeline
from tests.helpers import spec


def test_a_raising_recorder_leaves_the_runs_timing_prediction_and_verdict(tmp_path, monkeypatch):
    def save(self, stem):
        raise RuntimeError("_set_memory_metadata: not in this release")

    monkeypatch.setattr(timeline.Recording, "save", save)  # after the pass's steps ran under the recording tracker
    record = worker.run(spec("tests.workloads:mlp", check=True), tmp_path / "ckpt.json")
    assert record.status == "ok" and record.timeline is None
    assert record.timeline_error == "RuntimeError: _set_memory_metadata: not in this release"
    assert record.memory is not None and record.memory.peak_allocated_bytes > 0
    assert record.timing is not None and record.timing.median_s > 0
    assert record.prediction is not None and record.prediction.within  # the CPU prediction: the same bytes
    assert record.equivalence is not None
    assert read_result(tmp_path / "ckpt.json").timeline_error == record.timeline_error
    assert "(no timeline: RuntimeError: _set_memory_metadata" in run_line(record)


def test_an_out_of_memory_in_the_recording_pass_is_still_the_runs_answer(tmp_path, monkeypatch):
    import torch

    def save(self, stem):
        raise torch.OutOfMemoryError("the budget")

    monkeypatch.setattr(timeline.Recording, "save", save)
    record = worker.run(spec("tests.workloads:mlp"), tmp_path / "baseline.json")
    assert record.status == "oom" and "during timeline" in record.error and record.timeline_error is None
