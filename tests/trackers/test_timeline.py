"""Timelines: exact categories at every event, the peak kept to the byte, phases marked, and the tutorial's story
(baseline peaks in the optimizer step; optimizer-in-backward does not, with fewer gradients alive)."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
import torch

from membench.cli import build_parser
from membench.common.errors import UserError
from membench.results import read_result
from membench.trackers import cuda
from membench.trackers import timeline as tl
from tests.sweeps import run_one, tiny_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tiny_sweep(tmp_path_factory.mktemp("timeline"))
    return {n: read_result(out / f"{n}.json") for n in ("baseline", "opt-in-bwd")}, out


def test_timeline_peak_equals_result_peak_to_the_byte(sweep):
    results, out = sweep
    for result in results.values():
        info, memory = result.timeline, result.memory
        timeline = tl.load(out / info.file)
        assert info.file_bytes == (out / info.file).stat().st_size
        assert info.peak_bytes == memory.peak_allocated_bytes == max(timeline.totals())
        assert timeline.peak.breakdown == memory.breakdown_at_peak == info.breakdown_at_peak
        assert timeline.peak.phase == memory.peak_phase
        assert timeline.steps == tl.TIMELINE_STEPS and timeline.x == sorted(timeline.x)


def test_phases_are_marked_per_step(sweep):
    results, out = sweep
    spans = tl.load(out / results["baseline"].timeline.file).spans
    for step in range(tl.TIMELINE_STEPS):
        phases = [s.phase for s in spans if s.step == step]
        assert phases == ["forward", "backward", "optimizer"], phases
    # opt-in-bwd steps inside backward: no optimizer phase of its own.
    spans = tl.load(out / results["opt-in-bwd"].timeline.file).spans
    assert [s.phase for s in spans if s.step == 0] == ["forward", "backward"]


def test_baseline_peaks_in_optimizer_step_and_opt_in_bwd_does_not(sweep):
    results, _ = sweep
    base, fused = results["baseline"].memory, results["opt-in-bwd"].memory
    assert base.peak_phase == "optimizer"
    assert fused.peak_phase != "optimizer"
    assert fused.breakdown_at_peak["gradients"] < base.breakdown_at_peak["gradients"]
    assert fused.peak_allocated_bytes < base.peak_allocated_bytes
    # Same model, same optimizer: parameters and Adam state are the same bytes in both.
    for c in ("parameters", "optimizer_state"):
        assert fused.breakdown_at_peak[c] == base.breakdown_at_peak[c]


def test_downsampling_keeps_the_peak_exactly():
    events = []
    for i in range(20_000):
        step = i // 10_000
        events.append(("forward" if i % 10_000 < 5000 else "backward", step, (1000, i % 977, (i * 7919) % 1013, 0, 0,
                                                                               0, 0, 0)))
    events[17_345] = ("backward", 1, (1000, 5000, 5000, 7, 0, 0, 0, 0))  # one value per category
    t = tl.compact(events, max_points=200)
    assert len(t.x) <= 200 and t.events == 20_000
    assert max(t.totals()) == 11_007 == t.peak.bytes
    assert t.peak.breakdown["activations"] == 7 and t.peak.step == 1
    assert [(s.phase, s.step) for s in t.spans] == [("forward", 0), ("backward", 0), ("forward", 1),
                                                   ("backward", 1)]


def _small_timeline():
    events = [("forward", 0, (10, 20, 0, 0, 0, 0, 0, 0)), ("backward", 0, (10, 5, 30, 0, 0, 0, 0, 0))]
    return tl.compact(events, modules=["block.0", "head"])


def test_the_timeline_file_reads_back_as_written(tmp_path):
    t = _small_timeline()
    tl.write(tmp_path / "t.timeline.json", t)
    assert tl.load(tmp_path / "t.timeline.json") == t
    assert t.peak.bytes == 10 + 5 + 30 and t.modules == ["block.0", "head"] and t.module == [0, 1]


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(steps="2"), "field steps must be int, got \"2\""),
    (lambda d: d["bytes"]["activations"].pop(), "field bytes.activations must be one value per point (2), got 1"),
    (lambda d: d.update(phase=[0, 5]), "field phase must be indices into phases (0 to 1)"),
    (lambda d: d["peak"].pop("breakdown"), "field peak.breakdown is missing"),
])
def test_a_malformed_timeline_is_one_line_naming_the_file_and_field(tmp_path, change, message):
    data = json.loads(_small_timeline().to_json())
    change(data)
    path = tmp_path / "t.timeline.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as info:
        tl.load(path)
    assert str(info.value) == f"{path}: {message}"


def test_no_timeline_option(tmp_path):
    assert build_parser().parse_args(["run", "--no-timeline"]).timeline is False
    assert build_parser().parse_args(["run"]).timeline is True
    result = run_one(tmp_path, timeline=False)
    assert result.status == "ok" and result.timeline is None
    assert not list(tmp_path.glob("*.timeline.json"))


def test_trace_summary_counts_allocated_bytes():
    snapshot = {"segments": [], "device_traces": [[
        {"action": "alloc", "size": 512}, {"action": "alloc", "size": 1024},
        {"action": "free_requested", "size": 512}, {"action": "free_completed", "size": 512},
        {"action": "alloc", "size": 2048}]]}
    assert cuda.trace_summary(snapshot, 0, 100, 1000) == {"trace_entries": 5, "trace_truncated": False,
                                                          "trace_peak_allocated_bytes": 100 + 1024 + 2048}
    assert "trace_peak_allocated_bytes" not in cuda.trace_summary(snapshot, 0, 100, 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA snapshots and history)")
def test_cuda_recording_pass_writes_snapshot_and_categorised_timeline(tmp_path):
    result = run_one(tmp_path, device="cuda")
    info = result.timeline
    snap_path = tmp_path / info.snapshot
    assert info.snapshot_bytes == snap_path.stat().st_size > 0
    with open(snap_path, "rb") as f:
        snapshot = pickle.load(f)
    assert "segments" in snapshot and snapshot["device_traces"]
    timeline = tl.load(tmp_path / info.file)
    assert timeline.round_to == 512 and timeline.peak.breakdown["parameters"] > 0
    assert_trace_peak_agrees(info, _unseen_by_the_tracker(info))


def _unseen_by_the_tracker(info) -> int:
    """On the storage tracker's path (torch before 2.14) the timeline counts tensors, while the allocator's trace
    also holds cuBLAS's and cuBLASLt's workspaces, up to one of each per thread (a tiny model's step is far smaller
    than the 32 MiB ones of sm90: an H200 under torch 2.11 traced 1,668,608 B of tensors and 69,826,048 B in all)."""
    from membench.predict import gpus
    from membench.predict.emulate.versions import release

    if "storage tracker" not in (info.source or ""):
        return 0
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return 2 * (gpus.cublas_workspace_bytes((p.major, p.minor)) + gpus.cublaslt_workspace_bytes(release()))


def assert_trace_peak_agrees(info, unseen: int = 0) -> None:
    """The tracker (rounded to 512 B) sees tensors, the allocator blocks: the same order of magnitude, beyond up to
    `unseen` bytes the tracker cannot see, where the trace was whole (TimelineInfo is a dataclass: its field is None
    when the trace was truncated)."""
    if info.trace_peak_allocated_bytes is not None:
        assert info.peak_bytes / 2 < info.trace_peak_allocated_bytes < 2 * info.peak_bytes + unseen


def test_the_gpu_tests_trace_peak_check_reads_the_timeline_info():
    """CPU: the GPU test's check on a TimelineInfo as a CUDA run records it (it used `in` on the dataclass, a
    TypeError on the first GPU run)."""
    from membench.results import TimelineInfo

    info = TimelineInfo(file="t.json", file_bytes=1, events=2, points=2, steps=2, round_to=512, peak_bytes=1000,
                        peak_phase="backward", peak_step=0, breakdown_at_peak={}, trace_peak_allocated_bytes=1024)
    assert_trace_peak_agrees(info)
    assert_trace_peak_agrees(dataclasses.replace(info, trace_peak_allocated_bytes=None))
    with pytest.raises(AssertionError):
        assert_trace_peak_agrees(dataclasses.replace(info, trace_peak_allocated_bytes=4000))
    assert_trace_peak_agrees(dataclasses.replace(info, trace_peak_allocated_bytes=4000), unseen=3000)
    with pytest.raises(AssertionError):
        assert_trace_peak_agrees(dataclasses.replace(info, trace_peak_allocated_bytes=400), unseen=3000)


def test_y_ticks_land_on_round_values():
    from membench.report.timeline_html import round_ticks

    assert round_ticks(151.7) == [0, 50, 100, 150]  # not 0, 47, 93.9, 141 (quarters of the peak)
    assert round_ticks(1.0) == [0, 0.25, 0.5, 0.75, 1.0]
    assert round_ticks(0.37) == [0, 0.1, 0.2, 0.3]
    assert all(len(round_ticks(t)) <= 5 and round_ticks(t)[-1] <= t for t in (0.9, 3.3, 47.2, 999.0, 12345.0))
