"""One run, in its own process: build, warm up, measure memory, time steps, check equivalence, write the result.

Run as `python -m membench.worker SPEC.json RESULT.json`. It always tries to leave a result file behind: an
out-of-memory error becomes status "oom" with what was measured up to then, any other exception "error".
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from membench import distributed, environment, equivalence, lifeline
from membench.results import SCHEMA_VERSION, write_json
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import instantiate
from membench.trackers import timeline, timing
from membench.trackers.memory import make_meter
from membench.trackers.storage import StorageTracker
from membench.workloads import load_workload


def execute(spec: RunSpec, progress: dict, out: Path | None = None) -> dict:
    """Run one spec; `out` (the result file's path) is where the timeline and snapshot files go, next to it."""
    workload = load_workload(spec.workload)
    techniques = instantiate(spec)
    for t in techniques:
        t.validate(spec, workload)
    meter = make_meter(spec.device, spec.memory_budget)
    progress["meter"] = meter
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    if spec.device == "cuda" and out is not None:
        from membench.trackers import cuda

        oom_snapshot = _oom_snapshot(out)
        oom_snapshot.unlink(missing_ok=True)  # an earlier run's, not this one's
        cuda.snapshot_on_oom(oom_snapshot)
    rank, world = distributed.rank_world()
    data = batches(workload, spec, rank, world)

    def step(i: int) -> float:
        meter.start_step(i)
        batch = next(data)
        meter.track_inputs(batch)
        return train_step(state, batch, meter.phase)

    with meter.active():
        build_start = time.perf_counter()
        # Construction is its own phase: on CUDA the allocator's peak since it began; host memory is tracked
        # exactly too (building in fp32 on the host first is what init-on-device avoids).
        with meter.phase("setup"), StorageTracker(device_types=("cpu",)) as host:
            state = build_state(spec, workload, techniques, on_model=meter.attach_model)
        meter.attach_optimizers(state.optimizers)
        progress["build_s"] = time.perf_counter() - build_start
        progress["build_peak_bytes"] = meter.result()["peak_allocated_bytes"]
        progress["build_host_peak_bytes"] = host.peak.bytes
        progress["phase"] = "warmup"
        for i in range(spec.warmup):
            step(i)
        meter.reset_peak()
        progress["phase"] = "measure"
        if meter.device == "cuda":  # the allocator's counters cost nothing: time and measure the same steps
            times, losses = timing.time_steps(step, range(spec.warmup, spec.warmup + spec.steps))
        else:  # the exact tracker slows steps down: one measured step, then timed steps without it
            step(spec.warmup)
        memory = meter.result()
    if meter.device == "cpu":
        progress["phase"] = "time"
        times, losses = timing.time_steps(step, range(spec.warmup + 1, spec.warmup + 1 + spec.steps))
    memory["build_peak_bytes"] = progress["build_peak_bytes"]
    memory["build_host_peak_bytes"] = progress["build_host_peak_bytes"]
    progress["memory"] = memory
    recorded = None
    if spec.timeline and out is not None:
        progress["phase"] = "timeline"
        first = spec.warmup + spec.steps + (1 if meter.device == "cpu" else 0)
        recorded = _record_timeline(meter, step, first, _stem(out))

    progress["phase"] = "flops"
    flops = timing.count_flops(lambda: step(-1))
    summary = timing.summarize(times)
    # Data parallel ranks step together: the run trains world x batch-size samples per step.
    samples_per_s = spec.batch_size * world / summary["median_s"]
    device_name = environment.describe(spec.device)["device_name"]
    peak = spec.peak_flops or timing.peak_flops(device_name, "bf16" if _low_precision(techniques) else "fp32")
    summary.update({
        "warmup_steps": spec.warmup,
        "samples_per_s": samples_per_s,
        "throughput": samples_per_s * workload.items_per_sample,
        "unit": f"{workload.unit}/s",
        "flops_per_step": flops,
        "achieved_flops": flops / summary["median_s"],
        "peak_flops": peak,
        "mfu": flops / summary["median_s"] / peak if peak else None,
        "losses": losses,
        "build_s": progress["build_s"],
    })
    del state, data
    progress["timing"] = summary
    result = {"memory": memory, "timing": summary}
    if world > 1 or spec.nproc_per_node > 1 or distributed.launched_by_torchrun():
        result["world_size"] = world
        result["ranks"] = distributed.gather(_rank_summary(rank, memory, summary))
    if recorded is not None:
        result["timeline"] = recorded
    if spec.check:
        progress["phase"] = "equivalence"
        result["equivalence"] = equivalence.check(spec, workload)
    return result


def _mark_diverged(record: dict) -> None:
    """A run whose loss became NaN or inf measured a broken training: status 'diverged', not 'ok'."""
    losses = (record.get("timing") or {}).get("losses") or []
    first = next((i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)
    if first is not None:
        record.update(status="diverged", diverged_at_timed_step=first,
                      error=f"the loss became {losses[first]} at timed step {first + 1} of {len(losses)}")


def _rank_summary(rank: int, memory: dict, timing_summary: dict) -> dict:
    keys = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_phase", "build_peak_bytes",
            "build_host_peak_bytes", "breakdown_at_peak")
    return {"rank": rank, **{k: memory.get(k) for k in keys}, "median_s": timing_summary["median_s"]}


def _record_timeline(meter, step, first: int, stem: Path) -> dict:
    """A separate pass of a few untimed steps that records every allocation and free: recording slows steps
    down, so it runs after the measured and timed steps and never overlaps them. Its failure is reported in
    the result, not raised: the measurements already taken stand."""
    try:
        with meter.recording(stem) as recording:
            for i in range(first, first + timeline.TIMELINE_STEPS):
                step(i)
        return recording.save(stem)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        return {"error": f"{type(exc).__name__}: {exc}"}


def _oom_snapshot(out: Path) -> Path:
    stem = _stem(out)
    return stem.parent / f"{stem.name}.oom.pickle"


def _stem(out: Path) -> Path:
    """Where a run's side files go: `<run>.timeline.json` beside `<run>.json` (`<run>.rank<N>...` off rank 0,
    as every rank of a distributed run records: the steps need all of them)."""
    rank = int(os.environ.get("RANK", "0"))
    return out.parent / (out.name.removesuffix(".json") + (f".rank{rank}" if rank else ""))


def _low_precision(techniques) -> bool:
    return any(t.numerics == "precision" for t in techniques)


def run(spec: RunSpec, out: Path) -> dict:
    """Execute one spec and write its result file (rank 0 only, under torchrun); returns the result."""
    with distributed.process_group(spec.device):
        return _run(spec, out)


def _run(spec: RunSpec, out: Path) -> dict:
    progress: dict = {"phase": "setup"}
    started = time.time()
    record = {"schema_version": SCHEMA_VERSION, "name": spec.name, "spec": spec.to_dict(),
              "env": environment.describe(spec.device), "started": started}
    try:
        record.update(execute(spec, progress, out))
        record["status"] = "ok"
        _mark_diverged(record)
    except torch.OutOfMemoryError as exc:
        record.update(status="oom", error=f"out of memory during {progress['phase']}: {str(exc).splitlines()[0]}")
        meter = progress.get("meter")
        record["memory"] = progress.get("memory") or (meter.result() if meter is not None else None)
        record["timing"] = progress.get("timing")
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model becomes this run's status
        record.update(status="error", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=8))
        record["memory"] = progress.get("memory")
        record["timing"] = progress.get("timing")
    oom_snapshot = _oom_snapshot(out)
    if record["status"] == "oom" and oom_snapshot.exists():
        record["oom_snapshot"] = {"file": oom_snapshot.name, "file_bytes": oom_snapshot.stat().st_size}
    record["wall_s"] = time.time() - started
    if distributed.rank_world()[0] == 0:
        write_json(out, record)
    return record


def main(argv: list[str]) -> int:
    lifeline.tie_worker_to_sweep()  # a worker never outlives the sweep that launched it
    spec = RunSpec.from_dict(json.loads(Path(argv[0]).read_text()))
    run(spec, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
