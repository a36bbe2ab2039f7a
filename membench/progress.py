"""A progress display for sweeps (rich): which run is going, and each finished run's headline numbers.

Nothing printed here is rich markup: run names, paths, error messages and our own notes may hold '[...]' (a
shard name, '[noisy timing ...]'), which rich would parse as markup, dropping the text or failing the sweep
with a MarkupError. Every line goes through rich.markup.escape.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from membench.units import fmt_bytes


class SweepProgress:
    def __init__(self, specs, out_dir):
        self.console = Console(stderr=True)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
        self.task = self.progress.add_task("sweep", total=len(specs))
        self.console.print(escape(f"membench: {len(specs)} run(s) of {specs[0].workload} at batch "
                                  f"{specs[0].batch_size} on {specs[0].device} -> {out_dir}"))

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def start(self, spec) -> None:
        self.progress.update(self.task, description=escape(f"running {spec.name}"))

    def note(self, spec, message: str) -> None:
        self.console.print(escape(f"  {spec.name}: {message}"), soft_wrap=True)

    def done(self, spec, result: dict, skipped: bool) -> None:
        mem = result.get("memory") or {}
        timing = result.get("timing") or {}
        line = f"{spec.name}: {result['status']}"
        if mem.get("peak_allocated_bytes") is not None:
            line += f", peak {fmt_bytes(mem['peak_allocated_bytes'])} in {mem.get('peak_phase')}"
        if timing.get("throughput"):
            line += f", {timing['throughput']:.1f} {timing['unit']}"
        if timing.get("noisy"):
            line += f" [noisy timing: IQR {timing['iqr_s'] / timing['median_s']:.0%} of the median]"
        if result.get("error"):
            line += f" ({result['error'].splitlines()[0][:160]})"
        self.console.print(escape(("  (resumed) " if skipped else "  ") + line))
        self.progress.advance(self.task)
