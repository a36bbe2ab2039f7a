"""report.html: one self-contained file. Charts are inline SVG, the CSS and the timeline's script are inline,
there is no font and nothing fetched from the network, so it opens offline and can be mailed or attached to a CI
run as is. Every piece of text that comes from a result file goes through html.escape (and, in the timeline's
embedded data, JSON escaping with no '<'; the script sets only textContent), and a file a result names is linked
only where it is a regular file inside that result's folder (fsio.side_file), by a relative, percent-encoded
path: a crafted name ('javascript:...', '../../', an absolute path) links to nothing.
"""

from __future__ import annotations

import html
import os
import re
import urllib.parse
from pathlib import Path

from membench.common.fsio import side_file
from membench.common.units import fmt_bytes
from membench.common.vocab import CATEGORIES
from membench.report import timeline_html
from membench.report.beside import prediction_html
from membench.report.view import RunView, SweepView
from membench.results import Environment, RunRecord
from membench.results.sweep import Sweep

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
.chart{margin:1em 0;overflow-x:auto}.chart svg{max-width:100%;height:auto}
.run{border:1px solid #ddd;border-radius:6px;padding:.4em 1em;margin:1em 0}
.verdict-bitwise,.verdict-equivalent{color:#1a7f37}.verdict-not-equivalent{color:#b42318;font-weight:bold}
.status-oom,.status-diverged,.status-error,.status-timeout{color:#b42318;font-weight:bold}
.muted{color:#666;font-size:.9em}
.recommendation{border-left:4px solid #1a7f37;background:#f3faf4;padding:.3em 1em}
code{background:#f5f5f5;padding:0 .2em}
""" + timeline_html.CSS

_E = html.escape


def inline_svg(svg: str, prefix: str) -> str:
    """An SVG file's text ready to sit inside HTML: no XML prolog or metadata, and ids made unique per chart
    (two charts both defining a glyph or clip path of the same id would otherwise clash in one document)."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r'(xlink:href|href)="#([^"]+)"', lambda m: f'{m.group(1)}="#{prefix}-{m.group(2)}"', svg)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)


def _table(headers: list[str], body: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{_E(str(h))}</th>" for h in headers)
    rows = "".join("<tr>" + "".join(f"<td>{_E(str(c))}</td>" for c in row) + "</tr>" for row in body)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _link(folder: Path, name: object, report_dir: Path, label: str) -> str | None:
    """A link to the file `name` in a result's folder, or None where it is not a regular file there."""
    path = side_file(folder, name)
    if path is None:
        return None
    # Percent-encoded, so no file name can read as a scheme ('javascript:' becomes 'javascript%3A').
    href = urllib.parse.quote(Path(os.path.relpath(path, Path(report_dir).resolve())).as_posix())
    return f'<a href="{_E(href, quote=True)}">{_E(label)}</a>'


def _size(nbytes: object) -> str:
    return fmt_bytes(nbytes) if isinstance(nbytes, (int, float)) else "-"


def _environment(sweep: Sweep) -> str:
    env = next((r.env for r in sweep.runs if r.env and r.env.torch), None) or Environment(device="-")
    fields = [("device", env.device), ("device name", env.device_name), ("torch", env.torch),
              ("CUDA", env.cuda), ("driver", env.driver_version), ("python", env.python),
              ("host", env.host), ("platform", env.platform), ("git commit", env.git_commit)]
    return _table(["", "value"], [[k, v if v is not None else "-"] for k, v in fields])


def _files(result: RunRecord, report_dir: Path) -> str:
    if result.path is None:
        return ""
    where = result.path.parent
    links = []
    info = result.timeline
    if info is not None:
        links.append(_link(where, info.file, report_dir, f"timeline ({_size(info.file_bytes)})"))
        if info.snapshot:
            links.append(_link(where, info.snapshot, report_dir,
                               f"CUDA snapshot ({_size(info.snapshot_bytes)}; open it in pytorch.org/memory_viz)"))
    if result.oom_snapshot is not None:
        oom = result.oom_snapshot
        links.append(_link(where, oom.file, report_dir, f"snapshot at OOM ({_size(oom.file_bytes)})"))
    links = [link for link in links if link]
    return f'<p class="muted">Files: {" · ".join(links)}</p>' if links else ""


def _run_section(run: RunView, baseline: RunView | None, report_dir: Path) -> str:
    result, name, status = run.record, run.name, run.status
    memory = result.memory
    parts = [f'<div class="run"><h3>{_E(name)} <span class="status-{_E(status, quote=True)}">{_E(status)}</span></h3>']
    parts.append("<ul>" + "".join(f"<li>{_E(s)}</li>" for s in run.story) + "</ul>")
    mine, base = run.parts(), baseline.parts() if baseline else None
    if mine:
        body = []
        for c in CATEGORIES:
            row = [c.replace("_", " "), fmt_bytes(mine.get(c, 0)), mine.get(c, 0)]
            if base and run is not baseline:
                row.append(fmt_bytes(mine.get(c, 0) - base.get(c, 0)) if mine.get(c, 0) != base.get(c, 0) else "0")
            body.append(row)
        headers = ["category at the peak", "size", "bytes"] + (["vs baseline"] if base and run is not baseline
                                                               else [])
        parts.append(_table(headers, body))
    if memory is not None:
        parts.append(f"<p>Peak phase: <b>{_E(memory.peak_phase)}</b> (step {memory.peak_step} of the measured run, "
                     "counting the warm-up steps from 0; the timeline below is a pass of its own).</p>")
    if memory is not None and memory.top_modules:
        parts.append("<p>Where the peak comes from, by module (what each held at the peak):</p>")
        parts.append(_table(["module", "category", "size", "bytes"],
                            [[m.module, m.category.replace("_", " "), fmt_bytes(m.bytes), m.bytes]
                             for m in memory.top_modules], "modules"))
    if memory is not None and memory.top_sites:
        parts.append(_table(["allocation site (CUDA trace, at its peak)", "size", "blocks"],
                            [[s.site, fmt_bytes(s.bytes), s.blocks] for s in memory.top_sites], "sites"))
    eq = result.equivalence
    if eq is not None:
        v = eq.verdict
        parts.append(f'<p>Equivalence: <span class="verdict-{_E(v, quote=True)}">{_E(v)}</span>'
                     f' — {_E(eq.detail)}</p>')
    parts.append(prediction_html(result.prediction))  # report/beside.py
    parts.append(_files(result, report_dir))
    parts.append("</div>")
    return "\n".join(parts)


def render(v: SweepView, charts: dict[str, dict], report_dir: Path) -> str:
    """The whole page as a string, formatted from the sweep's view; `charts` maps a chart name to charts.save()'s
    output."""
    sweep, title, headers, body = v.sweep, v.heading, list(v.headers), [list(r) for r in v.rows]
    captions = {"peak": "Peak memory by technique (stacked by category at the peak; dashed line: the baseline)",
                "timelines": "Memory timelines on one scale: baseline vs each technique",
                "pareto": "Memory vs throughput, with the Pareto front: each run timed apart, so a change of load "
                           "between runs is in no bar; the summary's speed vs base is timed in alternation"}
    timeline = timeline_html.render(list(sweep.runs))
    # The interactive timeline replaces the static one in the page (report.md keeps timelines.png).
    shown = {n: c for n, c in charts.items() if not (timeline and n == "timelines")}
    chart_html = "".join(
        f'<figure class="chart" id="chart-{name}">{inline_svg(c["svg_text"], f"c{i}")}'
        f"<figcaption>{_E(captions.get(name, name))}</figcaption></figure>"
        for i, (name, c) in enumerate(shown.items()))
    sections = "\n".join(_run_section(r, v.reference, report_dir) for r in v.runs)
    advice = list(v.advice)
    advice_html = (f'<div class="recommendation"><p><b>{_E(advice[0])}</b></p>'
                   + "".join(f"<p>{_E(s)}</p>" for s in advice[1:]) + "</div>")
    said = v.notes
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_E(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>
<body>
<h1>{_E(title)}</h1>
<p class="muted">Peak = the largest amount of live tensor memory during a measured step (GiB = 2<sup>30</sup> bytes).
Categories and phases come from membench's storage tracker; on CUDA they come from the recording pass,
rounded to the allocator's 512-byte blocks.</p>
<h2>Recommendation</h2>
{advice_html}
<h2>Summary</h2>
{_table(headers, body, "summary")}
{"".join(f'<p class="muted">Note: {_E(n)}</p>' for n in said)}
<p class="muted">Step times: median ± half its confidence interval (order statistics: 95%, or min to max below 6
steps). Speed against the baseline: both timed in alternation in the run's own process, so a change of the
machine's load cancels; a change whose interval holds no change is marked "within noise" and is not a measured
difference.</p>
<h2>Memory timeline</h2>
{timeline or '<p>No timeline: no run recorded one (<code>--no-timeline</code>, or none finished).</p>'}
<h2>The peak by category</h2>
{_table(list(v.breakdown_headers), v.breakdown_rows)}
<h2>Charts</h2>
{chart_html or '<p>No chart: no run finished.</p>'}
<h2>What each technique did</h2>
{sections}
<h2>Environment</h2>
{_environment(sweep)}
</body></html>
"""
