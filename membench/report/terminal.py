"""What `membench run` prints when its sweep ends and `membench report` prints: per sweep, the table, where the
baseline's peak comes from, and the recommendation, each formatted from the sweep's one `SweepView`."""

from __future__ import annotations

from membench.report.recommend import Goal
from membench.report.table import join_tables, render_parts, top_modules_text
from membench.report.view import SweepView, view
from membench.results.sweep import Sweep


def summary(sweeps: list[Sweep], goal: Goal, fmt: str = "simple") -> str:
    return summary_of([view(s, goal) for s in sweeps], fmt)


def summary_of(views: list[SweepView], fmt: str = "simple") -> str:
    """The tables, then for each sweep the baseline's largest modules at its peak and the recommendation."""
    parts = [join_tables([render_parts(v.title, v.headers, v.rows, v.notes, fmt) for v in views], fmt)]
    for v in views:
        lines = [f"{v.title}:"] if len(views) > 1 else []
        base = v.sweep.baseline
        top = top_modules_text(base) if base is not None else None
        if top:
            lines += [top, ""]
        parts.append("\n".join(lines + list(v.advice)))
    return "\n\n".join(parts)
