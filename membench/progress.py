"""A progress display for sweeps (rich): which run is going, and each finished run's headline numbers.

Nothing printed here is rich markup: run names, paths, error messages and our own notes may hold '[...]' (a
shard name, '[noisy timing ...]'), which rich would parse as markup, dropping the text or failing the sweep
with a MarkupError. Every line goes through rich.markup.escape.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from membench.report.noise import step_ms
from membench.report.table import module_phrase
from membench.results import RunRecord
from membench.units import fmt_bytes


class SweepProgress:
    def __init__(self, jobs, out_dir):
        self.console = Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
        self.task = self.progress.add_task("sweep", total=len(jobs))
        run = jobs[0].run
        self.console.print(escape(f"membench: {len(jobs)} run(s) of {run.workload} at batch {run.batch_size} "
                                  f"on {run.device} -> {out_dir}"))

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def start(self, job) -> None:
        self.progress.update(self.task, description=escape(f"running {job.name}"))

    def note(self, job, message: str) -> None:
        self.console.print(escape(f"  {job.name}: {message}"), soft_wrap=True)

    def done(self, job, result: RunRecord, skipped: bool) -> None:
        mem, timing = result.memory, result.timing
        line = f"{job.name}: {result.status}"
        if mem is not None:
            line += f", peak {fmt_bytes(mem.peak_allocated_bytes)} in {mem.peak_phase}"
            if mem.top_modules:
                line += f" (most: {module_phrase(mem.top_modules[0])})"
        if timing is not None and timing.throughput:
            line += f", {timing.throughput:.1f} {timing.unit} (step {step_ms(timing)} ms)"
            if timing.noisy:
                line += " [noisy timing: treat small differences as noise]"
        if result.error:
            line += f" ({result.error.splitlines()[0][:160]})"
        # markup=False: "[noisy timing ...]" is text, not a rich style tag (as markup it vanished from the line).
        self.console.print(("  (resumed) " if skipped else "  ") + line, markup=False, soft_wrap=True)
        self.progress.advance(self.task)
