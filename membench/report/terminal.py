"""What `membench run` prints when its sweep ends and `membench report` prints: per sweep, the table, where the
baseline's peak comes from, and the recommendation."""

from __future__ import annotations

from membench.report.recommend import Goal, recommend
from membench.report.table import render, top_modules_text
from membench.report.words import recommendation_lines
from membench.results.sweep import Sweep


def summary(sweeps: list[Sweep], goal: Goal, fmt: str = "simple") -> str:
    """The tables, then for each sweep the baseline's largest modules at its peak and the recommendation."""
    parts = [render(sweeps, fmt)]
    for sweep in sweeps:
        lines = [f"{sweep.title()}:"] if len(sweeps) > 1 else []
        top = top_modules_text(sweep.baseline) if sweep.baseline is not None else None
        if top:
            lines += [top, ""]
        parts.append("\n".join(lines + recommendation_lines(recommend(sweep, goal))))
    return "\n\n".join(parts)
