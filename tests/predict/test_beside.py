"""The prediction beside each measurement (predict/beside.py, report/beside.py). On CPU: a run's prediction for
the CPU target equals its measurement to the byte. The CUDA comparison runs on a snapshot the test makes, in the
format of torch's snapshots (/work/shared/gpu-truth's traces: device_traces entries with action, addr, size,
frames, user_metadata), standing in for a GPU's recording pass."""

from __future__ import annotations

import dataclasses
import json
import pickle
import types

import pytest

from membench.child import worker
from membench.predict import beside
from membench.report.beside import prediction_lines
from membench.results import Memory, read_result
from membench.trackers import cuda
from tests.helpers import spec

H100_SXM = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, max_threads_per_multi_processor=2048)


def test_the_target_is_the_table_entry_with_this_gpus_capability_and_multiprocessors():
    assert beside.target_for("cpu").gpu is None
    assert beside.target_for("cuda", H100_SXM, "NVIDIA H100 80GB HBM3").gpu == "H100"
    assert beside.target_for("cuda", H100_SXM, "NVIDIA H200").gpu == "H200"
    pcie = types.SimpleNamespace(**{**vars(H100_SXM), "multi_processor_count": 114})
    assert beside.target_for("cuda", pcie, "NVIDIA H100 PCIe").gpu == "H100-PCIe"
    odd = types.SimpleNamespace(**{**vars(H100_SXM), "multi_processor_count": 66})
    near = beside.target_for("cuda", odd, "NVIDIA H100 (a MIG slice)")
    assert near.gpu == "H100" and "66 SMs" in near.described and "may differ" in near.described
    missing = beside.target_for("cuda", types.SimpleNamespace(major=11, minor=0, multi_processor_count=20,
                                                              max_threads_per_multi_processor=1536), "NVIDIA Thor")
    assert isinstance(missing, str) and "11.0" in missing and "spec/gpu.py" in missing


def test_a_recorded_gpus_name_gives_its_own_table_entry():
    # what validate_gpu_runs.py and trace_differences.py predict a recorded run for
    assert beside.target_named("NVIDIA H200").gpu == "H200"
    assert beside.target_named("NVIDIA H100 PCIe").gpu == "H100-PCIe"
    assert beside.target_named("NVIDIA A100-SXM4-80GB").gpu == "A100"


def test_a_cpu_run_records_its_prediction_beside_it_equal_to_the_byte(tmp_path):
    record = worker.run(spec("tests.workloads:mlp"), tmp_path / "baseline.json")
    check = record.prediction
    assert record.status == "ok" and check.status == "ok" and check.target == "cpu"
    assert check.tolerance == 0 and check.within
    assert check.predicted_peak_allocated_bytes == record.memory.peak_allocated_bytes == \
        check.measured_peak_allocated_bytes
    assert read_result(tmp_path / "baseline.json").prediction == check
    assert prediction_lines(check)[0].endswith("(the same bytes): within the tolerance (0: the same bytes)")


def test_no_predict_records_none(tmp_path):
    record = worker.run(spec("tests.workloads:mlp", predict=False), tmp_path / "baseline.json")
    assert record.status == "ok" and record.prediction is None


@pytest.fixture(scope="module")
def on_h100():
    """tests.workloads:mlp predicted for an H100, as a CUDA run on one predicts it, and its step's events."""
    job = spec("tests.workloads:mlp", device="cuda", batch_size=8)
    target = beside.target_for("cuda", H100_SXM, "NVIDIA H100 80GB HBM3")
    predicted = beside.predict_for(job, target)
    return job, target, predicted, beside.predicted_step(predicted.traced, predicted.sides)


def _snapshot(step, labels: cuda.AllocatorLabels) -> dict:
    """A recording pass's snapshot whose first step makes exactly `step`'s allocations and frees, labelled."""
    entries, live, addresses = [], {}, iter(range(0x7F0000000000, 0x7F0100000000, 0x10000))
    for event in step:
        meta = cuda.SEP.join((labels.token, "backward", "0", event.module or "(no module)",
                              event.category or "other"))
        frames = [{"filename": "/home/me/model.py", "line": 5, "name": "forward"}]
        if event.kind == "alloc":
            address = next(addresses)
            live.setdefault(event.size, []).append(address)
        else:
            address = live[event.size].pop() if live.get(event.size) else next(addresses)
        action = "alloc" if event.kind == "alloc" else "free_completed"
        entries.append({"action": action, "addr": address, "size": event.size, "frames": frames,
                        "user_metadata": meta})
    return {"segments": [], "device_traces": [entries], "allocator_settings": {}}


def _recorded(step, tmp_path) -> list[cuda.RecordedEvent]:
    labels = cuda.AllocatorLabels()
    path = tmp_path / "baseline.snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot(step, labels), protocol=4))
    snapshot = pickle.loads(path.read_bytes())
    return cuda.replay_history(snapshot["device_traces"][0], labels, 0, lambda size: size).first_step


def _measured(allocated: int, reserved: int) -> Memory:
    return Memory(device="cuda", method="torch.cuda.max_memory_allocated", peak_phase="backward", peak_step=0,
                  peak_allocated_bytes=allocated, peak_reserved_bytes=reserved)


def test_a_cuda_measurement_within_the_tolerance_is_the_same(on_h100, tmp_path):
    job, target, predicted, step = on_h100
    memory = predicted.traced.memory
    allocated = memory.allocator_peak_allocated_bytes
    recorded = _recorded(step, tmp_path)
    assert [(e.kind, e.size) for e in recorded] == [(e.kind, e.size) for e in step]
    check = beside.compare(job, predicted, _measured(allocated + allocated // 200, memory.peak_reserved_bytes),
                           target, recorded, tmp_path / "baseline")
    assert check.within and check.tolerance == beside.TOLERANCE and check.divergence is None and check.hint is None
    assert check.allocated_error == pytest.approx(-(allocated // 200) / (allocated + allocated // 200))
    assert not (tmp_path / "baseline.prediction.json").exists()


def test_a_cuda_measurement_that_differs_names_where_the_steps_part_ways(on_h100, tmp_path):
    job, target, predicted, step = on_h100
    memory = predicted.traced.memory
    k = next(i for i, e in enumerate(step) if e.kind == "alloc" and e.category == "activations" and i > 3)
    changed = list(step)
    changed[k] = dataclasses.replace(step[k], size=step[k].size + 4096, category="temporaries")
    recorded = _recorded(changed, tmp_path)
    check = beside.compare(job, predicted, _measured(memory.allocator_peak_allocated_bytes * 2,
                                                     memory.peak_reserved_bytes), target, recorded,
                           tmp_path / "baseline")
    assert not check.within and check.allocated_error == pytest.approx(-0.5)
    d = check.divergence
    assert d.index == k
    assert (d.predicted.kind, d.predicted.size, d.predicted.category, d.predicted.module) == \
        ("alloc", step[k].size, "activations", step[k].module)
    assert (d.measured.kind, d.measured.size, d.measured.category, d.measured.module, d.measured.site) == \
        ("alloc", step[k].size + 4096, "temporaries", step[k].module, "/home/me/model.py:5 (forward)")
    assert d.predicted.site == step[k].site and d.predicted.site.endswith(")")  # 'file:line (function)'
    assert "baseline.snapshot.pickle" in check.hint and "baseline.prediction.json" in check.hint
    written = json.loads((tmp_path / "baseline.prediction.json").read_text())
    assert len(written["predicted_step"]) == len(step)
    lines = prediction_lines(check)
    assert "outside the tolerance (1%)" in lines[0] and f"after {k} allocations and frees" in lines[1]
    assert lines[-1] == check.hint


def test_the_same_events_with_different_peaks_say_the_allocator_differs(on_h100, tmp_path):
    job, target, predicted, step = on_h100
    check = beside.compare(job, predicted, _measured(1, 1), target, _recorded(step, tmp_path), tmp_path / "b")
    assert check.divergence is None and "the same as recorded, event for event" in check.detail


def test_the_html_report_shows_the_prediction_escaped(on_h100, tmp_path):
    from membench.report.beside import prediction_html

    job, target, predicted, step = on_h100
    check = beside.compare(job, predicted, _measured(1, 1), target, _recorded(step, tmp_path), tmp_path / "b<x>")
    text = prediction_html(check)
    assert text.startswith('<p class="verdict-not-equivalent">Predicted beside measured: prediction for H100')
    assert "b&lt;x&gt;.prediction.json" in text and "<x>" not in text
    assert prediction_html(None) == ""
