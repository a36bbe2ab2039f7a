"""One run, in its own process: build -> memory -> timeline -> timing -> FLOPs -> equivalence -> record.

Run as `python -m membench.worker JOB.json RESULT.json`. It always tries to leave a result file behind: an
out-of-memory error becomes status "oom" with what was measured up to then, any other exception "error" with
its traceback (in the record and in the run's log).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from membench import distributed, environment, equivalence, lifeline, progress
from membench.measure import Build, Session
from membench.results import (
    Environment,
    Equivalence,
    FileRef,
    Memory,
    RankSummary,
    RunRecord,
    TimelineInfo,
    Timing,
    write_record,
)
from membench.spec import Job
from membench.step import batches
from membench.techniques import Stack, resolve
from membench.trackers import timing
from membench.trackers.memory import make_meter
from membench.workloads import Workload, load_workload


class Worker:
    """The stages of one run. Each returns its typed piece; what finished before a failure stays in the record."""

    def __init__(self, job: Job, out: Path | None):
        self.job, self.spec, self.out = job, job.run, out
        self.session: Session | None = None
        self.memory: Memory | None = None
        self.timing: Timing | None = None
        self.timeline: TimelineInfo | None = None
        self.build_info: Build | None = None

    @property
    def stage(self) -> str:
        return self.session.stage if self.session else "setup"

    def execute(self) -> dict:
        """Run every stage; returns the record's fields (memory, timing, timeline, equivalence, ranks)."""
        spec, how = self.spec, self.job.measure
        workload = load_workload(spec.workload, spec.seq_len)
        stack = resolve(spec)
        stack.validate(spec, workload)
        meter = make_meter(spec.device, spec.memory_budget)
        if spec.device == "cuda" and self.out is not None:
            _watch_oom(self.out)
        rank, world = distributed.rank_world()
        self.session = session = Session(spec, stack, workload, meter, batches(workload, spec, rank, world))
        progress.report("build")
        self.build_info = session.build()
        progress.report("warmup", steps=how.warmup)
        session.warm_up(how.warmup)
        times: list[float] = []

        def timed_step(k: int) -> None:  # 'timing step k of n'; past --steps, --min-time decides how many
            progress.report("time", k, how.steps if k <= how.steps else None)

        if meter.device == "cpu":  # the exact tracker slows steps down: one measured step, timed steps apart
            progress.report("measure", steps=1)
            self.memory = self._with_build(session.measure(1)[0])
        if how.timeline and self.out is not None:
            progress.report("timeline")
            self.timeline = session.record_timeline(_stem(self.out))
        tensor_bytes = meter.current()
        session.detach()
        if meter.device == "cuda":  # the allocator's counters cost nothing: time and measure the same steps
            memory, times, losses = session.measure(
                how.steps, run_steps=lambda step, idx: timing.time_steps(step, idx, how.min_time_s, timed_step))
            if self.timeline is not None:  # where the peak comes from: seen in the recording pass only on CUDA
                memory.top_modules, memory.top_sites = self.timeline.top_modules, self.timeline.top_sites
            self.memory = self._with_build(memory)
            progress.report("flops")
            flops = timing.count_flops(lambda: session.bare_step(-1))
        else:
            # With nothing of membench in the steps, a budget on CPU holds through host memory (RSS) instead.
            with _host_budget(spec.memory_budget, tensor_bytes, "the timed steps"):
                times, losses = timing.time_steps(session.bare_step, session.timed_indices(how.steps),
                                                  how.min_time_s, timed_step)
                progress.report("flops")
                flops = timing.count_flops(lambda: session.bare_step(-1))
        self.timing = self._timing(times, losses, flops, workload, stack, world)
        session.state = None  # free the model and optimizer before the equivalence check builds two more
        fields = {"memory": self.memory, "timing": self.timing, "timeline": self.timeline}
        if world > 1 or stack.distributed or distributed.launched_by_torchrun():
            fields["world_size"] = world
            fields["ranks"] = [RankSummary(**r) for r in distributed.gather(_rank_summary(rank, self.memory,
                                                                                         self.timing))]
        if how.check:
            progress.report("check", steps=how.check_steps)
            fields["equivalence"] = self._equivalence(workload, stack)
        return fields

    def _with_build(self, memory: Memory) -> Memory:
        memory.build_peak_bytes = self.build_info.peak_bytes
        memory.build_host_peak_bytes = self.build_info.host_peak_bytes
        return memory

    def _timing(self, times, losses, flops: int, workload: Workload, stack: Stack, world: int) -> Timing:
        summary = timing.summarize(times)
        # Data parallel ranks step together: the run trains world x batch-size samples per step.
        samples_per_s = self.spec.batch_size * world / summary.median_s
        peak = self.job.measure.peak_flops or timing.peak_flops(
            environment.describe(self.spec.device)["device_name"], "bf16" if stack.low_precision else "fp32")
        summary.warmup_steps = self.job.measure.warmup
        summary.samples_per_s = samples_per_s
        summary.throughput = samples_per_s * workload.items_per_sample
        summary.unit = f"{workload.unit}/s"
        summary.flops_per_step = flops
        summary.achieved_flops = flops / summary.median_s
        summary.peak_flops = peak
        summary.mfu = flops / summary.median_s / peak if peak else None
        summary.losses = losses
        summary.build_s = self.build_info.seconds
        return summary

    def _equivalence(self, workload: Workload, stack: Stack) -> Equivalence:
        return equivalence.check(self.spec, stack, workload, self.job.measure.check_steps)


def _mark_diverged(record: RunRecord) -> None:
    """A run whose loss became NaN or inf measured a broken training: status 'diverged', not 'ok'."""
    losses = (record.timing.losses if record.timing else None) or []
    first = next((i for i, loss in enumerate(losses) if loss is None or not math.isfinite(loss)), None)
    if first is not None:
        record.status, record.diverged_at_timed_step = "diverged", first
        record.error = f"the loss became {losses[first]} at timed step {first + 1} of {len(losses)}"


def _host_budget(budget: int | None, tensor_bytes: int, what: str):
    from membench.trackers.host import rss_budget

    return rss_budget(budget, tensor_bytes, what) if budget else contextlib.nullcontext()


def _rank_summary(rank: int, memory: Memory, timing_summary: Timing) -> dict:
    return {"rank": rank, "peak_allocated_bytes": memory.peak_allocated_bytes,
            "peak_reserved_bytes": memory.peak_reserved_bytes, "peak_phase": memory.peak_phase,
            "build_peak_bytes": memory.build_peak_bytes, "build_host_peak_bytes": memory.build_host_peak_bytes,
            "breakdown_at_peak": memory.breakdown_at_peak, "median_s": timing_summary.median_s}


def _watch_oom(out: Path) -> None:
    from membench.trackers import cuda

    oom_snapshot = _oom_snapshot(out)
    oom_snapshot.unlink(missing_ok=True)  # an earlier run's, not this one's
    cuda.snapshot_on_oom(oom_snapshot)


def _oom_snapshot(out: Path) -> Path:
    stem = _stem(out)
    return stem.parent / f"{stem.name}.oom.pickle"


def _stem(out: Path) -> Path:
    """Where a run's side files go: `<run>.timeline.json` beside `<run>.json` (`<run>.rank<N>...` off rank 0,
    as every rank of a distributed run records: the steps need all of them)."""
    rank = int(os.environ.get("RANK", "0"))
    return out.parent / (out.name.removesuffix(".json") + (f".rank{rank}" if rank else ""))


def run(job: Job, out: Path) -> RunRecord:
    """Execute one job and write its result file (rank 0 only, under torchrun); returns the record."""
    with distributed.process_group(job.run.device):
        return _run(job, out)


def _run(job: Job, out: Path) -> RunRecord:
    started = time.time()
    record = RunRecord(name=job.name, status="ok", spec=job, env=Environment(**environment.describe(job.run.device)),
                       started=started)
    worker = Worker(job, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for key, value in worker.execute().items():
            setattr(record, key, value)
        _mark_diverged(record)
    except torch.OutOfMemoryError as exc:
        record.status = "oom"
        record.error = f"out of memory during {worker.stage}: {str(exc).splitlines()[0]}"
        record.memory = worker.memory or (worker.session.meter.result() if worker.session else None)
        record.timing, record.timeline = worker.timing, worker.timeline
    except Exception as exc:  # noqa: BLE001 - any failure (the user's model, or a membench bug) is this run's status
        traceback.print_exc()  # into the run's log, whole
        record.status = "error"
        record.error = f"{type(exc).__name__} during {worker.stage}: {exc}"
        record.traceback = traceback.format_exc(limit=12)
        record.memory, record.timing, record.timeline = worker.memory, worker.timing, worker.timeline
    oom_snapshot = _oom_snapshot(out)
    if record.status == "oom" and oom_snapshot.exists():
        record.oom_snapshot = FileRef(file=oom_snapshot.name, file_bytes=oom_snapshot.stat().st_size)
    record.wall_s = time.time() - started
    if distributed.rank_world()[0] == 0:
        write_record(out, record)
    return record


def main(argv: list[str]) -> int:
    lifeline.tie_worker_to_sweep()  # a worker never outlives the sweep that launched it
    job = Job.from_dict(json.loads(Path(argv[0]).read_text()))
    run(job, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
