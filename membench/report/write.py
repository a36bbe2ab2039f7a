"""`membench report`: from a results directory to report.md, results.csv, the charts and report.html."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from membench.common.fsio import atomic_write_text, own_dir
from membench.common.units import fmt_bytes
from membench.report import charts as ch
from membench.report import html
from membench.report.recommend import Goal
from membench.report.table import inert_markdown, join_tables, render_parts
from membench.report.view import SweepView, view
from membench.results import to_frame
from membench.results.sweep import Sweep


def markdown(v: SweepView, chart_files: dict[str, dict]) -> str:
    e = inert_markdown  # every text from result files: shown, never rendered as HTML or a link

    def table(rows, headers) -> str:
        return tabulate([[e(c) for c in row] for row in rows], headers=headers, tablefmt="github",
                        disable_numparse=True)

    lines = [f"# {e(v.heading)}", "", "## Recommendation", ""] + [f"- {e(s)}" for s in v.advice] + [
             "", join_tables([render_parts(v.title, v.headers, v.rows, v.notes, "github")], "github"), "",
             "## The peak by category", "", table(v.breakdown_rows, v.breakdown_headers), ""]
    for name, files in chart_files.items():
        lines += [f"![{name}]({files['png'].name})", ""]
    lines += ["## What each technique did", ""]
    for r in v.runs:
        lines += [f"### {e(r.name)}", ""] + [f"- {e(s)}" for s in r.story] + [""]
        if r.breakdown:
            rows = [[c.replace("_", " "), fmt_bytes(n), n] for c, n in r.breakdown]
            lines += [table(rows, ["category at the peak", "size", "bytes"]), ""]
        if r.top_modules:
            rows = [[m.module, m.category.replace("_", " "), fmt_bytes(m.bytes), m.bytes] for m in r.top_modules[:5]]
            lines += [table(rows, ["module at the peak", "category", "size", "bytes"]), ""]
    return "\n".join(lines)


def write_report(sweep: Sweep, out_dir: Path, goal: Goal = Goal("lowest-peak")) -> dict[str, Path]:
    """Write everything under out_dir; returns name -> path of each file written."""
    out_dir = own_dir(out_dir)  # a planted `report` link would have membench overwrite files wherever it points
    v = view(sweep, goal)  # computed once: every file below formats it
    chart_files = ch.write_all(v, out_dir)
    written: dict[str, Path] = {}
    for name, files in chart_files.items():
        written[f"{name}.png"], written[f"{name}.svg"] = files["png"], files["svg"]
    written["results.csv"] = out_dir / "results.csv"
    atomic_write_text(written["results.csv"], to_frame(list(sweep.runs)).to_csv(index=False))
    written["report.md"] = out_dir / "report.md"
    atomic_write_text(written["report.md"], markdown(v, chart_files))
    written["report.html"] = out_dir / "report.html"
    atomic_write_text(written["report.html"], html.render(v, chart_files, out_dir))
    return written
