"""Progress inside a sweep, shown as it goes (the stages come from membench.launch.progress).

Shown three ways: `membench run` draws a live line per run with rich (SweepProgress); the Python API prints one
quiet line per stage to stderr, which notebooks show (StageLines); or a caller's own callback gets each Stage.

Nothing printed here is rich markup: run names, paths, error messages and our own notes may hold '[...]' (a
shard name, '[noisy timing ...]'), which rich would parse as markup, dropping the text or failing the sweep
with a MarkupError. Every line goes through rich.markup.escape or is printed with markup=False.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from membench.common.units import fmt_bytes, fmt_duration, fmt_number
from membench.report.beside import prediction_lines
from membench.report.noise import step_ms
from membench.report.table import module_phrase
from membench.results import RunRecord
from membench.results.progress import STAGE_WORDS, Stage


class Estimate:
    """Seconds left in a sweep, from the runs finished so far (runs of one sweep take roughly alike)."""

    def __init__(self, total: int):
        self.total, self.walls = total, []

    def finished(self, wall_s: float | None) -> None:
        if wall_s:
            self.walls.append(wall_s)

    def left_s(self, started: int, current_elapsed_s: float) -> float | None:
        """None until a run has finished: before that there is nothing to go by."""
        if not self.walls:
            return None
        mean = sum(self.walls) / len(self.walls)
        return max(0.0, mean - current_elapsed_s) + mean * (self.total - started)


LONG_S = 120.0  # a run with more than this left after its warm-up says so, at its warm-up's pace
TIMELINE_STEPS = 2  # the timeline pass's steps (trackers/timeline.TIMELINE_STEPS; a test holds them equal)


def steps_after_warmup(job) -> int:
    """Training steps a run takes after its warm-up, as the worker runs them (child/worker.py): the measured
    step(s), the timeline pass, the timed steps (--min-time can add more), the FLOP count, then for a technique
    the baseline timed beside it (its warm-up and a step of each per pair), and the check's two models."""
    how, device = job.measure, job.run.device
    steps = (1 if device == "cpu" else how.steps) + (TIMELINE_STEPS if how.timeline else 0) + how.steps + 1
    if job.run.techniques:
        steps += max(how.warmup, 1) + 2 * how.compare_pairs
    return steps + (2 * how.check_steps if how.check else 0)


class Pace:
    """Says, once a run's warm-up is over, how long the rest of it takes at the warm-up's pace, when that is long
    (a CPU run of a large model can take many minutes in silence otherwise)."""

    def __init__(self):
        self.warmup_at: float | None = None

    def seen(self, job, stage: Stage) -> str | None:
        if stage.stage == "warmup":
            self.warmup_at = stage.elapsed_s
            return _before_warmup(job, stage)
        if self.warmup_at is None or job.measure.warmup < 1:
            return None
        step_s = (stage.elapsed_s - self.warmup_at) / job.measure.warmup
        self.warmup_at, steps = None, steps_after_warmup(job)
        if step_s * steps < LONG_S:
            return None
        more = " (--min-time can add timed steps)" if job.measure.min_time_s else ""
        return (f"a step took {fmt_duration(step_s)} in warm-up: at that pace this run needs about "
                f"{fmt_duration(step_s * steps)} more ({steps} more steps{more})" + _held(job, stage))


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The memory this machine can give new work now without swapping (Linux's MemAvailable); None elsewhere."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # in kB, that is KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


# Optimizer states per parameter, each of the parameter's size (Adam's two moments; SGD with momentum its buffer).
STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1}


def _later(job) -> list[str]:
    """What a run does after its measured steps that holds two models at once."""
    return (["the baseline's model is built beside it to time the two"] if job.run.techniques else []) + (
        ["the equivalence check trains two models side by side"] if job.measure.check else [])


def _before_warmup(job, stage: Stage) -> str | None:
    """Before the first step of a CPU run: when the least its steps can hold (the parameters, their gradients and
    the optimizer's states, each the parameters' size), twice that where it later holds two models, is more than
    this machine has available, it says so now rather than being killed for memory minutes later. Silent otherwise
    (and for an optimizer whose states it does not know, or a user's)."""
    states = STATES.get(job.run.optimizer)
    available = available_bytes()
    if job.run.device != "cpu" or not stage.model_bytes or states is None or available is None:
        return None
    least, later = stage.model_bytes * (2 + states), _later(job)
    if least * (2 if later else 1) <= available:
        return None
    held = "its parameters and their gradients" + (f" and {job.run.optimizer}'s {states} state" + "s" * (states > 1)
                                                    if states else "")
    return (f"before its first step: this model's parameters are {fmt_bytes(stage.model_bytes)}, so {held} hold at "
            f"least {fmt_bytes(least)}" + (f", and twice that later, when {' and '.join(later)}" if later else "")
            + f": more than the {fmt_bytes(available)} this machine has available now (MemAvailable), so it may be "
            "killed for memory" + ("; --no-check leaves out the check" if job.measure.check else ""))


def _held(job, stage: Stage) -> str:
    """The worker's host memory so far, what is still to come that holds two models at once, and whether twice
    what it holds (two such models) is more than this machine has available: a CPU run that would be killed for
    memory minutes from now says so after its warm-up."""
    if not stage.host_peak_bytes:
        return ""
    later = _later(job)
    said = (f"; its peak host memory so far is {fmt_bytes(stage.host_peak_bytes)} (RSS)"
            + (f", and later {' and '.join(later)}" if later else ""))
    available = available_bytes()
    if later and available is not None and 2 * stage.host_peak_bytes > available:
        said += (f": twice that is more than the {fmt_bytes(available)} this machine has available now (MemAvailable),"
                 " so it may be killed for memory" + ("; --no-check leaves out the check" if job.measure.check else ""))
    return said


def run_line(result: RunRecord, skipped: bool = False, wall_s: float | None = None) -> str:
    """A finished run's headline numbers, one line; wall_s: how long the run took, process start included."""
    mem, timing = result.memory, result.timing
    line = f"{result.name}: {result.status}"
    if mem is not None:
        line += f", peak {fmt_bytes(mem.peak_allocated_bytes)} in {mem.peak_phase}"
        if mem.top_modules:
            line += f" (most: {module_phrase(mem.top_modules[0])})"
    if timing is not None and timing.throughput:
        line += f", {fmt_number(timing.throughput)} {timing.unit} (step {step_ms(timing)} ms)"
        if timing.noisy:
            line += " [noisy timing: treat small differences as noise]"
    if wall_s is not None and not skipped:
        line += f", {fmt_duration(wall_s)}"
    if result.error:
        line += f" ({result.error.splitlines()[0][:160]})"
    if result.timeline_error:
        line += f" (no timeline: {result.timeline_error[:160]})"
    return ("(resumed) " if skipped else "") + line


class SweepProgress:
    """`membench run`'s terminal display: a live line for the running run (its stage, elapsed time, what is left
    of the sweep) and a lasting line per finished run."""

    def __init__(self, jobs, out_dir):
        self.console = Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=12),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[left]}"),
                                 console=self.console, transient=True)
        self.task = self.progress.add_task("sweep", total=len(jobs), left="")
        self.estimate = Estimate(len(jobs))
        self.started, self.run_started = 0, time.monotonic()
        self.pace = Pace()
        run = jobs[0].run
        self.console.print(escape(f"membench: {len(jobs)} run(s) of {run.workload} at batch {run.batch_size} "
                                  f"on {run.device} -> {out_dir}"))

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def start(self, job) -> None:
        self.started += 1
        self.run_started = time.monotonic()
        self.progress.update(self.task, description=escape(f"{job.name}: {STAGE_WORDS['start']}"),
                             left=self._left(0.0))

    def stage(self, job, stage: Stage) -> None:
        said = self.pace.seen(job, stage)
        if said:
            self.note(job, said)
        self.progress.update(self.task, description=escape(f"{job.name}: {stage.describe()} "
                                                           f"({fmt_duration(stage.elapsed_s)} in)"),
                             left=self._left(stage.elapsed_s))

    def _left(self, elapsed_s: float) -> str:
        left = self.estimate.left_s(self.started, elapsed_s)
        return "" if not left else f"about {fmt_duration(left)} left"

    def note(self, job, message: str) -> None:
        self.console.print(escape(f"  {job.name}: {message}"), soft_wrap=True)

    def done(self, job, result: RunRecord, skipped: bool) -> None:
        wall = time.monotonic() - self.run_started
        if not skipped:
            self.estimate.finished(wall)
        # markup=False: "[noisy timing ...]" is text, not a rich style tag (as markup it vanished from the line).
        self.console.print("  " + run_line(result, skipped, wall), markup=False, soft_wrap=True)
        for line in prediction_lines(result.prediction):
            self.console.print("    " + line, markup=False, soft_wrap=True)
        self.progress.advance(self.task)


class StageLines:
    """The Python API's default: one plain line per stage on stderr (a notebook shows them under the cell),
    without the per-step lines of the timing stage."""

    def __init__(self, file=None):
        self.file = file
        self.started = time.monotonic()
        self.job, self.pace = None, Pace()

    def start(self, job) -> None:
        self.started, self.job = time.monotonic(), job

    def __call__(self, stage: Stage) -> None:
        said = self.pace.seen(self.job, stage) if self.job is not None else None
        if said:
            self.note(self.job, said)
        if stage.step is not None and stage.step > 1:
            return
        words = Stage(stage.run, stage.stage, steps=stage.steps).describe()
        print(f"membench: {stage.run}: {words} ({fmt_duration(stage.elapsed_s)} in)", file=self.file or sys.stderr,
              flush=True)

    def done(self, job, result: RunRecord, skipped: bool) -> None:
        print(f"membench: {run_line(result, skipped, time.monotonic() - self.started)}",
              file=self.file or sys.stderr, flush=True)
        for line in prediction_lines(result.prediction):
            print(f"membench:   {line}", file=self.file or sys.stderr, flush=True)

    def note(self, job, message: str) -> None:
        print(f"membench: {job.name}: {message}", file=self.file or sys.stderr, flush=True)
