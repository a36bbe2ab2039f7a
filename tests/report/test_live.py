"""The live progress display prints text from result files as text, never as markup."""

from __future__ import annotations

from pathlib import Path

# --- the progress display prints text, never markup -----------------------------------------------------------

def test_progress_prints_brackets_as_text():
    import io

    from rich.console import Console

    from membench.report.live import SweepProgress
    from membench.results import RunRecord, Timing
    from membench.spec import Job, RunSpec

    spec = Job(RunSpec("tests.workloads:mlp", 4, ("ckpt",)))
    progress = SweepProgress([spec], Path("/data/[bold]results"))
    progress.console = Console(file=io.StringIO(), width=400)
    failed = RunRecord(name="ckpt", status="error", spec=spec,
                       error="OSError: could not open shard [/data/train-000.tar]")
    noisy = RunRecord(name="ckpt", status="ok", spec=spec,
                      timing=Timing(step_times_s=[1.0], median_s=1.0, iqr_s=0.5, min_s=1.0, max_s=1.0, noisy=True,
                                    throughput=10.0, unit="samples/s"))
    progress.done(spec, failed, False)
    progress.done(spec, noisy, False)
    progress.note(spec, "[red]not markup[/red]")
    text = progress.console.file.getvalue()
    assert "could not open shard [/data/train-000.tar]" in text
    assert "[noisy timing: treat small differences as noise]" in text
    assert "[red]not markup[/red]" in text
