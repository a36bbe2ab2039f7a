"""`membench report`: from a results directory to report.md, results.csv, the charts and report.html."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from membench.common.fsio import atomic_write_text, own_dir
from membench.common.units import fmt_bytes
from membench.common.vocab import CATEGORIES
from membench.report import charts as ch
from membench.report import explain as ex
from membench.report import html
from membench.report.recommend import Goal, recommend
from membench.report.table import BREAKDOWN_HEADERS, breakdown_rows, inert_markdown
from membench.report.table import render as render_table
from membench.report.words import recommendation_lines, story_lines
from membench.results import to_frame
from membench.results.sweep import Sweep


def markdown(sweep: Sweep, chart_files: dict[str, dict], goal: Goal = Goal("lowest-peak")) -> str:
    e = inert_markdown  # every text from result files: shown, never rendered as HTML or a link

    def table(rows, headers) -> str:
        return tabulate([[e(c) for c in row] for row in rows], headers=headers, tablefmt="github",
                        disable_numparse=True)

    advice = recommendation_lines(recommend(sweep, goal))
    lines = [f"# {e(sweep.heading())}", "", "## Recommendation", ""] + [f"- {e(s)}" for s in advice] + [
             "", render_table([sweep], fmt="github"), "", "## The peak by category", "",
             table(breakdown_rows(sweep), BREAKDOWN_HEADERS), ""]
    for name, files in chart_files.items():
        lines += [f"![{name}]({files['png'].name})", ""]
    lines += ["## What each technique did", ""]
    for r in sweep.runs:
        lines += [f"### {e(r.name)}", ""] + [f"- {e(s)}" for s in story_lines(ex.explain(r, sweep.reference))] + [""]
        parts = ex.breakdown(r)
        if parts:
            rows = [[c.replace("_", " "), fmt_bytes(parts.get(c, 0)), parts.get(c, 0)] for c in CATEGORIES]
            lines += [table(rows, ["category at the peak", "size", "bytes"]), ""]
        top = r.memory.top_modules if r.memory else None
        if top:
            rows = [[m.module, m.category.replace("_", " "), fmt_bytes(m.bytes), m.bytes] for m in top[:5]]
            lines += [table(rows, ["module at the peak", "category", "size", "bytes"]), ""]
    return "\n".join(lines)


def write_report(sweep: Sweep, out_dir: Path, goal: Goal = Goal("lowest-peak")) -> dict[str, Path]:
    """Write everything under out_dir; returns name -> path of each file written."""
    out_dir = own_dir(out_dir)  # a planted `report` link would have membench overwrite files wherever it points
    chart_files = ch.write_all(sweep, out_dir)
    written: dict[str, Path] = {}
    for name, files in chart_files.items():
        written[f"{name}.png"], written[f"{name}.svg"] = files["png"], files["svg"]
    written["results.csv"] = out_dir / "results.csv"
    atomic_write_text(written["results.csv"], to_frame(list(sweep.runs)).to_csv(index=False))
    written["report.md"] = out_dir / "report.md"
    atomic_write_text(written["report.md"], markdown(sweep, chart_files, goal))
    written["report.html"] = out_dir / "report.html"
    atomic_write_text(written["report.html"], html.render(sweep, chart_files, out_dir, goal))
    return written
