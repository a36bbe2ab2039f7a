"""`membench report`: from a results directory to report.md, results.csv, the charts and report.html."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from membench.common.errors import UserError
from membench.common.fsio import atomic_write_text, own_dir
from membench.common.units import fmt_bytes
from membench.common.vocab import CATEGORIES
from membench.report import charts as ch
from membench.report import explain as ex
from membench.report import html
from membench.report.recommend import Goal, recommend
from membench.report.table import BREAKDOWN_HEADERS, breakdown_rows, inert_markdown
from membench.report.table import render as render_table
from membench.results import RunRecord, to_frame


def check_one_sweep(results: list[RunRecord]) -> None:
    """A report compares techniques against one baseline: one workload, batch size and device."""
    keys = sorted({(*r.sweep_key[:3], r.spec.run.loop) for r in results}, key=str)
    if len(keys) > 1:
        found = "; ".join(f"{w} batch {b} on {d}" + (f" ({loop})" if loop else "") for w, b, d, loop in keys)
        raise UserError(f"these results hold more than one sweep ({found}): point `membench report` at one "
                        "sweep's directory, e.g. results/<machine>/<workload>-bs<N>")


def title_for(results: list[RunRecord]) -> str:
    workload, batch, device, *_ = results[0].sweep_key
    name = (results[0].env.device_name if results[0].env else None) or device
    return f"membench: {workload}, batch {batch}, on {name}"


def ordered(results: list[dict]) -> list[dict]:
    """The baseline first, then the runs in the order they ran."""
    return sorted(results, key=lambda r: (r.name != "baseline", r.started or float("inf"), r.name))


def markdown(results: list[RunRecord], chart_files: dict[str, dict], title: str,
             goal: Goal = Goal("lowest-peak")) -> str:
    e = inert_markdown  # every text from result files: shown, never rendered as HTML or a link

    def table(rows, headers) -> str:
        return tabulate([[e(c) for c in row] for row in rows], headers=headers, tablefmt="github",
                        disable_numparse=True)

    baseline = ex.find_baseline(results)
    lines = [f"# {e(title)}", "", "## Recommendation", ""] + [f"- {e(s)}" for s in recommend(results, goal)] + [
             "", render_table(results, fmt="github"), "", "## The peak by category", "",
             table(breakdown_rows(results), BREAKDOWN_HEADERS), ""]
    for name, files in chart_files.items():
        lines += [f"![{name}]({files['png'].name})", ""]
    lines += ["## What each technique did", ""]
    for r in results:
        lines += [f"### {e(r.name)}", ""] + [f"- {e(s)}" for s in ex.explain(r, baseline)] + [""]
        parts = ex.breakdown(r)
        if parts:
            rows = [[c.replace("_", " "), fmt_bytes(parts.get(c, 0)), parts.get(c, 0)] for c in CATEGORIES]
            lines += [table(rows, ["category at the peak", "size", "bytes"]), ""]
        top = r.memory.top_modules if r.memory else None
        if top:
            rows = [[m.module, m.category.replace("_", " "), fmt_bytes(m.bytes), m.bytes] for m in top[:5]]
            lines += [table(rows, ["module at the peak", "category", "size", "bytes"]), ""]
    return "\n".join(lines)


def write_report(results: list[RunRecord], out_dir: Path, goal: Goal = Goal("lowest-peak")) -> dict[str, Path]:
    """Write everything under out_dir; returns name -> path of each file written."""
    check_one_sweep(results)
    results = ordered(results)
    out_dir = own_dir(out_dir)  # a planted `report` link would have membench overwrite files wherever it points
    title = title_for(results)
    chart_files = ch.write_all(results, out_dir)
    written: dict[str, Path] = {}
    for name, files in chart_files.items():
        written[f"{name}.png"], written[f"{name}.svg"] = files["png"], files["svg"]
    written["results.csv"] = out_dir / "results.csv"
    atomic_write_text(written["results.csv"], to_frame(results).to_csv(index=False))
    written["report.md"] = out_dir / "report.md"
    atomic_write_text(written["report.md"], markdown(results, chart_files, title, goal))
    written["report.html"] = out_dir / "report.html"
    atomic_write_text(written["report.html"], html.render(results, chart_files, out_dir, title, goal))
    return written
