"""One run, in its own process: build -> memory -> timeline -> timing -> FLOPs -> equivalence -> record.

Run as `python -m membench.child.worker JOB.json RESULT.json`. It always tries to leave a result file behind: an
out-of-memory error becomes status "oom" with what was measured up to then, any other exception "error" with
its traceback (in the record and in the run's log).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from membench import environment, equivalence
from membench.common.vocab import Numerics
from membench.launch import distributed, lifeline, progress
from membench.measure import Build, Session
from membench.results import (
    Compiled,
    Environment,
    Equivalence,
    FileRef,
    Interleaved,
    Memory,
    PredictionCheck,
    RankSummary,
    RunRecord,
    TimelineInfo,
    Timing,
    write_record,
)
from membench.spec import Job
from membench.step import batches, build_state, train_step
from membench.techniques import Stack, resolve
from membench.trackers import compilations, timing
from membench.trackers.host import host_refusal
from membench.trackers.memory import make_meter
from membench.workloads import Workload, load_workload


class NotCompared(Exception):
    """Why a run's speed was not timed against the baseline's in its own process (recorded as the reason)."""


@dataclasses.dataclass
class Measured:
    """What the stages of one run measured, each None until its stage finished: after a failure, what finished
    before it still goes into the record."""

    memory: Memory | None = None
    timing: Timing | None = None
    timeline: TimelineInfo | None = None
    equivalence: Equivalence | None = None
    world_size: int | None = None  # set for a distributed run only, as `ranks`
    ranks: list[RankSummary] | None = None
    numerics: Numerics | None = None  # the stack's, once resolved
    prediction: PredictionCheck | None = None
    timeline_error: str | None = None  # the recording pass failed; the stages after it ran
    compiled: Compiled | None = None

    def record_on(self, record: RunRecord) -> None:
        record.memory, record.timing, record.timeline = self.memory, self.timing, self.timeline
        record.equivalence, record.world_size, record.ranks = self.equivalence, self.world_size, self.ranks
        record.numerics = self.numerics
        record.prediction = self.prediction
        record.timeline_error = self.timeline_error
        record.compiled = self.compiled


class Worker:
    """The stages of one run. Each fills its typed piece of `measured`."""

    def __init__(self, job: Job, out: Path | None):
        self.job, self.spec, self.out = job, job.run, out
        self.session: Session | None = None
        self.measured = Measured()
        self.build_info: Build | None = None
        self.leave_group = False  # under torchrun: this rank failed out of step with the others (see _equivalence)

    # What a failed run keeps: the pieces that finished before the failure.
    @property
    def memory(self) -> Memory | None:
        return self.measured.memory

    @property
    def timing(self) -> Timing | None:
        return self.measured.timing

    @property
    def timeline(self) -> TimelineInfo | None:
        return self.measured.timeline

    @property
    def stage(self) -> str:
        return self.session.stage if self.session else "setup"

    def execute(self) -> Measured:
        """Run every stage; returns what they measured."""
        spec = self.spec
        workload = load_workload(spec.workload, spec.seq_len)
        stack = resolve(spec)
        self.measured.numerics = stack.numerics
        stack.validate(spec, workload)
        meter = make_meter(spec.device, spec.memory_budget, compiled=stack.compiles)
        try:
            if spec.device == "cuda" and self.out is not None:
                _watch_oom(self.out)
            return self._stages(workload, stack, meter)
        finally:
            # A run in the caller's process (a notebook) leaves no memory fraction and no OOM snapshots behind.
            meter.close()
            if spec.device == "cuda":
                from membench.trackers import cuda

                cuda.stop_snapshot_on_oom()

    def _stages(self, workload: Workload, stack: Stack, meter) -> Measured:
        spec, how, done = self.spec, self.job.measure, self.measured
        rank, world = distributed.rank_world()
        data_rank, data_world = distributed.data_rank(spec)  # the ranks of one tp group share a batch
        self.session = session = Session(spec, stack, workload, meter, batches(workload, spec, data_rank, data_world))
        compiles = compilations.Watch(spec) if stack.compiles else None
        progress.report("build")
        self.build_info = session.build()
        # A rank's parameters are DTensor shards, whose numel is the whole: only a single process says its model's.
        progress.report("warmup", steps=how.warmup, model_bytes=None if world > 1 else sum(
            p.numel() * p.element_size() for p in session.state.model.parameters()))
        session.warm_up(how.warmup)
        if compiles:
            done.compiled = compiles.warmed_up()

        def timed_step(k: int) -> None:  # 'timing step k of n'; past --steps, --min-time decides how many
            progress.report("time", k, how.steps if k <= how.steps else None)

        # Memory is measured on steps of its own, never timed: the exact tracker slows steps down (one measured
        # step on CPU), and on CUDA reading the allocator's counters at each phase costs host time too.
        measured_steps = 1 if meter.device == "cpu" else how.steps
        progress.report("measure", steps=measured_steps)
        memory = session.measure(measured_steps)[0]
        done.memory = self._with_build(memory)
        if how.timeline and self.out is not None:
            progress.report("timeline")
            done.timeline = self._timeline(session)
            if done.timeline is not None and meter.device == "cuda":  # the peak's source: the recording pass's
                memory.top_modules, memory.top_sites = done.timeline.top_modules, done.timeline.top_sites
        tensor_bytes = meter.current()
        session.detach()
        # With nothing of membench in the steps, a budget on CPU holds through host memory (RSS) instead; on CUDA
        # the allocator's memory fraction still holds it.
        with _host_budget(spec.memory_budget if meter.device == "cpu" else None, tensor_bytes, "the timed steps"):
            times, losses = timing.time_steps(session.bare_step_on, session.timed_indices(how.steps),
                                              how.min_time_s, prepare=session.next_batch, on_step=timed_step)
            progress.report("flops")
            flops, not_counted = timing.count_flops(lambda: session.bare_step(-1))
        done.timing = self._timing(times, losses, flops, workload, stack, data_world)
        if compiles:
            done.compiled = compiles.done()
        done.timing.flops_not_counted = not_counted
        try:
            done.timing.vs_baseline = self._against_baseline(workload, stack, world)
        except NotCompared as why:
            done.timing.not_interleaved = str(why)
        session.release()  # the model and optimizer, freed before the equivalence check builds two more
        if meter.device == "cuda":
            torch.cuda.empty_cache()  # and their cached blocks, so the check's models get whole segments
        if world > 1 or stack.distributed or distributed.launched_by_torchrun():
            done.world_size = world
            done.ranks = distributed.gather(_rank_summary(rank, done.memory, done.timing))
        if how.check:
            progress.report("check", steps=how.check_steps)
            done.equivalence = self._equivalence(workload, stack)
        if how.predict and self.out is not None:  # after everything measured: it runs in this process
            progress.report("predict")
            done.prediction = self._prediction(meter)
        return done

    def _timeline(self, session: Session) -> TimelineInfo | None:
        """The recording pass, contained: it is the one stage that uses the allocator's labelled history
        (private.py), so a failure there is a note on the run and the stages after it (timing, equivalence, the
        prediction) still run. An OOM is not contained: the budget it hit is the run's answer."""
        try:
            return session.record_timeline(stem(self.out))
        except Exception as exc:  # noqa: BLE001 - any failure of the optional pass: said on the record, not the end
            if isinstance(exc, torch.OutOfMemoryError) or host_refusal(exc) is not None:
                raise
            traceback.print_exc()  # into the run's log, whole
            self.measured.timeline_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            session.stage = "measure"
            return None

    def _prediction(self, meter) -> PredictionCheck:
        """The run predicted for this device, beside what it measured (predict/beside.py)."""
        from membench.predict import beside

        self.session.stage = "predict"
        recorded = getattr(meter, "recorded", None)  # CUDA: the recording pass's first step, as the allocator saw it
        properties = name = None
        if meter.device == "cuda":
            device = torch.cuda.current_device()
            properties, name = torch.cuda.get_device_properties(device), torch.cuda.get_device_name(device)
        return beside.check(self.job, self.measured.memory, recorded.first_step if recorded else None,
                            stem(self.out), properties, name or "")

    def _with_build(self, memory: Memory) -> Memory:
        memory.build_peak_bytes = self.build_info.peak_bytes
        memory.build_host_peak_bytes = self.build_info.host_peak_bytes
        return memory

    def _timing(self, times, losses, flops: int | None, workload: Workload, stack: Stack, world: int) -> Timing:
        summary = timing.summarize(times)
        # Data parallel ranks step together: the run trains world x batch-size samples per step (world: the
        # data-parallel ranks; tensor-parallel ranks share their samples).
        samples_per_s = self.spec.batch_size * world / summary.median_s
        peak = self.job.measure.peak_flops or timing.peak_flops(
            environment.describe(self.spec.device).device_name, "bf16" if stack.low_precision else "fp32")
        summary.warmup_steps = self.job.measure.warmup
        summary.samples_per_s = samples_per_s
        summary.throughput = samples_per_s * workload.items_per_sample
        summary.unit = f"{workload.unit}/s"
        summary.flops_per_step = flops
        summary.achieved_flops = None if flops is None else flops / summary.median_s
        summary.peak_flops = peak
        summary.mfu = flops / summary.median_s / peak if peak and flops is not None else None
        summary.losses = losses
        summary.build_s = self.build_info.seconds
        return summary

    def _against_baseline(self, workload: Workload, stack: Stack, world: int) -> Interleaved:
        """The compare stage: the baseline built beside the run in this process and both timed step for step in
        alternation (timing.interleave), so that a change of the machine's load during the sweep, which runs
        timed one after another would take for the technique's cost, slows both alike and cancels in their ratio.
        Raises NotCompared with the reason where that cannot be done; its failure never fails the run."""
        spec, how = self.spec, self.job.measure
        if how.steps < 2:  # a run of one timed step (a memory gate's) asks for memory only: no speed claim
            raise NotCompared(f"not enough steps to compare speed (--steps {how.steps}: 2 or more time the run "
                              "against the baseline)")
        _check_comparable(spec, stack, world)
        if spec.device == "cuda":
            from membench.trackers import cuda

            cuda.stop_snapshot_on_oom()  # the run's memory is measured: an OOM here is the comparison's, not the run's
        pairs = how.compare_pairs
        progress.report("compare", steps=pairs)
        self.session.stage = "compare"
        reference = dataclasses.replace(spec, techniques=())
        state = None
        try:
            state = build_state(reference, workload, resolve(reference).techniques)
            data = batches(workload, reference)
            for _ in range(max(how.warmup, 1)):  # the optimizer's state made, as in the baseline's own run
                train_step(state, next(data))
            run = timing.Stepper(lambda: self.session.next_batch(0), self.session.bare_step_on)
            base = timing.Stepper(lambda: next(data), lambda batch: train_step(state, batch))
            run_times, base_times = timing.interleave(
                run, base, pairs, how.min_time_s,
                on_pair=lambda k: progress.report("compare", k, pairs if k <= pairs else None))
            return timing.compare(run_times, base_times)
        except Exception as exc:  # noqa: BLE001 - the run's measurements are done and stand
            oom = exc if isinstance(exc, torch.OutOfMemoryError) else host_refusal(exc)
            if oom is not None:
                raise NotCompared(f"the baseline did not fit beside the run: {str(oom).splitlines()[0]}") from None
            traceback.print_exc()
            raise NotCompared(f"timing the baseline beside the run raised {type(exc).__name__}: {exc}") from None
        finally:
            state = None
            gc.collect()
            if spec.device == "cuda":
                torch.cuda.empty_cache()

    def _equivalence(self, workload: Workload, stack: Stack) -> Equivalence:
        """The check's own failure (out of memory for its two models, a crash) is the check's verdict: the run's
        measurements are done and stand. Under torchrun, a failure every rank agreed on (distributed.agree) is
        the same; one inside a collective leaves this rank out of step with the others: it sets
        `leave_group`, and the rank exits after writing its record (run) so torchrun stops the others."""
        self.session.stage = "check"
        try:
            return equivalence.check(self.spec, stack, workload, self.job.measure.check_steps)
        except distributed.PeerFailed as exc:
            return Equivalence(verdict="failed", detail=f"the equivalence check did not finish: {exc}")
        except Exception as exc:  # noqa: BLE001 - torch.OutOfMemoryError included: the check's, not the run's
            traceback.print_exc()
            self.leave_group = distributed.rank_world()[1] > 1
            what = "ran out of memory" if isinstance(exc, torch.OutOfMemoryError) else f"raised {type(exc).__name__}"
            return Equivalence(verdict="failed", detail=f"the equivalence check {what} (the run's measurements "
                                                        f"stand): {str(exc).splitlines()[0] if str(exc) else ''}")


def _check_comparable(spec, stack: Stack, world: int) -> None:
    """Raise NotCompared where a baseline timed in this run's process would not be the baseline's step."""
    if not spec.techniques:
        raise NotCompared("the baseline is the reference")
    if world > 1 or stack.distributed:
        raise NotCompared("a distributed run: its ranks step together, the baseline alone in one process")
    if stack.env:
        raise NotCompared(f"it sets {', '.join(sorted(stack.env))} for its whole process: a baseline timed there "
                          "would not be the baseline")
    if spec.memory_budget is not None:
        raise NotCompared("--memory-budget: the baseline's model beside the run would count against its budget")


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


def _rank_summary(rank: int, memory: Memory, timing_summary: Timing) -> RankSummary:
    return RankSummary(rank=rank, peak_allocated_bytes=memory.peak_allocated_bytes,
                       peak_reserved_bytes=memory.peak_reserved_bytes, peak_phase=memory.peak_phase,
                       build_peak_bytes=memory.build_peak_bytes, build_host_peak_bytes=memory.build_host_peak_bytes,
                       breakdown_at_peak=memory.breakdown_at_peak, median_s=timing_summary.median_s)


def _watch_oom(out: Path) -> None:
    from membench.trackers import cuda

    if not cuda.history_supported():
        print("membench: backend:cudaMallocAsync takes no out-of-memory observer: an OOM of this run keeps no "
              "snapshot", file=sys.stderr)
        return
    oom_snapshot = _oom_snapshot(out)
    oom_snapshot.unlink(missing_ok=True)  # an earlier run's, not this one's
    cuda.snapshot_on_oom(oom_snapshot)


def _oom_snapshot(out: Path) -> Path:
    base = stem(out)
    return base.parent / f"{base.name}.oom.pickle"


def stem(out: Path) -> Path:
    """Where a run's side files go: `<run>.timeline.json` beside `<run>.json` (`<run>.rank<N>...` off rank 0,
    as every rank of a distributed run records: the steps need all of them)."""
    rank = int(os.environ.get("RANK", "0"))
    return out.parent / (out.name.removesuffix(".json") + (f".rank{rank}" if rank else ""))


def run(job: Job, out: Path) -> RunRecord:
    """Execute one job and write its result file; returns the record.

    Under torchrun every rank writes its record (rank 0 the run's result file, rank N
    distributed.rank_record_path), and a rank that failed out of step with the others (an OOM inside a step,
    whose collectives the others are waiting in) leaves at once with a non-zero exit: torchrun then stops the
    other ranks (instead of their hanging in a collective until the process group's timeout), and the launcher
    makes the run's result from the ranks' records (distributed.merge_ranks)."""
    with distributed.process_group(job.run.device):
        record, leave = _run(job, out)
        if leave and distributed.rank_world()[1] > 1:
            distributed.leave()
    return record


def _run(job: Job, out: Path) -> tuple[RunRecord, bool]:
    started = time.time()
    record = RunRecord(name=job.name, status="ok", spec=job, env=Environment(device=job.run.device), started=started)
    worker = Worker(job, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Inside the try: a process that cannot use CUDA (a child forked after CUDA started) still leaves a record.
        record.env = environment.describe(job.run.device)
        worker.execute().record_on(record)
        _mark_diverged(record)
    except Exception as exc:  # noqa: BLE001 - any failure (the user's model, or a membench bug) is this run's status
        # The host allocator's refusal of one allocation (past the machine, under any budget) is out of memory too.
        oom = exc if isinstance(exc, torch.OutOfMemoryError) else host_refusal(exc)
        if oom is not None:
            record.status = "oom"
            record.error = f"out of memory during {worker.stage}: {str(oom).splitlines()[0]}"
            record.memory = worker.memory or (worker.session.meter.result() if worker.session else None)
            record.timing, record.timeline = worker.timing, worker.timeline
        else:
            traceback.print_exc()  # into the run's log, whole
            record.status = "error"
            record.error = f"{type(exc).__name__} during {worker.stage}: {exc}"
            record.traceback = traceback.format_exc(limit=12)
            record.memory, record.timing, record.timeline = worker.memory, worker.timing, worker.timeline
    record.numerics = worker.measured.numerics  # a failed run too: whether it changes precision
    oom_snapshot = _oom_snapshot(out)
    if record.status == "oom" and oom_snapshot.exists():
        record.oom_snapshot = FileRef(file=oom_snapshot.name, file_bytes=oom_snapshot.stat().st_size)
    record.wall_s = time.time() - started
    rank = distributed.rank_world()[0]
    if job.launch.nodes.several and distributed.launched_by_torchrun():
        record.rank = rank
    write_record(out if rank == 0 else distributed.rank_record_path(out, rank), record)
    return record, record.status in ("oom", "error") or worker.leave_group


def main(argv: list[str]) -> int:
    lifeline.tie_worker_to_sweep()  # a worker never outlives the sweep that launched it
    job = Job.from_dict(json.loads(Path(argv[0]).read_text()))
    run(job, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
