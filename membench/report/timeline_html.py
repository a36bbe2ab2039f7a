"""The report's centrepiece: every run's memory timeline, one run per row, full width, on one shared y axis.

The rows are drawn here as inline SVG (so the page shows them even where scripts are off); a small inline script,
with the timelines' data embedded as JSON beside it, makes them explorable: hover shows the step, the phase, the
bytes by category and the module running at that point; clicking a step (or a button) zooms every row to it.
Nothing is fetched: the page stays one file.

SVG coordinates: x is the step scale times XS (step k spans [k*XS, (k+1)*XS)); y is the share of the shared
maximum times YS, downwards. The plots stretch to the width (preserveAspectRatio="none"), so they carry no text:
labels are HTML around them, and lines keep one pixel with vector-effect="non-scaling-stroke".
"""

from __future__ import annotations

import html
import json
import math

from membench.common.units import fmt_bytes
from membench.common.vocab import CATEGORIES
from membench.report.charts import COLORS, PHASE_COLORS, load_timeline, unit_for
from membench.results import RunRecord
from membench.results.timeline import Timeline

XS = 1000  # SVG units per step
YS = 1000  # SVG units for the shared maximum
HEADROOM = 1.08  # the y axis reaches a little above the highest peak


def round_ticks(top: float, most: int = 5) -> list[float]:
    """Ticks from 0 on round values (1, 2, 2.5 or 5 times a power of ten) up to `top`, at most `most` of them,
    so an axis reads 0, 50, 100, 150 MiB rather than 0, 47, 93.9, 141."""
    if top <= 0:
        return [0.0]
    power = 10 ** math.floor(math.log10(top / (most - 1)))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if top / (m * power) <= most - 1)
    return [round(k * step, 10) for k in range(int(top / step + 1e-9) + 1)]

_E = html.escape

CSS = """
body{overflow-x:hidden}#timeline{width:calc(100vw - 3em);margin-left:calc(50% - 50vw + 1.5em)}
#timeline .tl-controls{margin:.4em 0;display:flex;gap:.4em;flex-wrap:wrap;align-items:center}
#timeline button{font:inherit;font-size:.9em;padding:.15em .7em;border:1px solid #999;border-radius:4px;background:#fff;
cursor:pointer}#timeline button[aria-pressed=true]{background:#222;color:#fff}
.tl-row{display:grid;grid-template-columns:6.5em 1fr;column-gap:.5em;margin:.2em 0 .9em}
.tl-name{grid-column:1/3;font-weight:600;font-size:1em}.tl-name span{font-weight:normal;color:#555;font-size:.92em}
.tl-yaxis{position:relative;height:190px;font-size:.85em;color:#444;text-align:right}
.tl-yaxis span{position:absolute;right:.3em;transform:translateY(-50%)}
.tl-plotwrap{position:relative;height:190px;border-left:1px solid #444;border-bottom:1px solid #444;cursor:crosshair}
.tl-plotwrap svg{position:absolute;left:0;width:100%}
.tl-band{top:0;height:12px}.tl-plot{top:12px;height:178px}
.tl-cursor{position:absolute;top:0;bottom:0;width:0;border-left:1px solid #000;pointer-events:none;display:none}
.tl-xaxis{grid-column:2;position:relative;height:1.3em;font-size:.85em;color:#444}
.tl-xaxis span{position:absolute;transform:translateX(-50%);white-space:nowrap}
#tl-tip{position:fixed;z-index:10;background:#fff;border:1px solid #888;border-radius:4px;padding:.35em .6em;
font-size:.85em;line-height:1.35;box-shadow:0 2px 6px rgba(0,0,0,.2);pointer-events:none;display:none;max-width:28em}
#tl-tip table{margin:.2em 0 0;font-size:1em}#tl-tip td{border:0;padding:0 .4em 0 0}
.tl-legend{display:flex;flex-wrap:wrap;gap:.3em 1.1em;font-size:.88em;margin:.3em 0}
.tl-swatch{display:inline-block;width:.9em;height:.9em;vertical-align:-.1em;margin-right:.3em;border:1px solid #0003}
"""

# The script reads the data, never writes HTML from it (textContent only): names from results stay text.
SCRIPT = r"""
(function () {
  "use strict";
  var root = document.getElementById("timeline");
  var data = JSON.parse(document.getElementById("tl-data").textContent);
  var XS = data.xs, view = [0, data.steps];
  var tip = document.getElementById("tl-tip");
  var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
  function fmt(b) {
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(b) >= units[i][1]) return (b / units[i][1]).toFixed(2) + " " + units[i][0];
    }
    return b + " B";
  }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function index(xs, x) {  // the last point at or before x: memory stays as it was until the next event
    var lo = 0, hi = xs.length - 1;
    if (x <= xs[0]) return 0;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (xs[mid] <= x) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  function setView(a, b, label) {
    view = [a, b];
    root.querySelectorAll("svg[data-h]").forEach(function (svg) {
      svg.setAttribute("viewBox", (a * XS) + " 0 " + ((b - a) * XS) + " " + svg.getAttribute("data-h"));
    });
    root.setAttribute("data-view", a + "-" + b);
    root.querySelectorAll(".tl-controls button").forEach(function (btn) {
      btn.setAttribute("aria-pressed", String(btn.getAttribute("data-view") === a + "-" + b));
    });
    root.querySelectorAll(".tl-xaxis").forEach(function (axis) {
      axis.textContent = "";
      for (var k = 0; k <= 4; k++) {
        var x = a + (b - a) * k / 4, s = el("span", "step " + x.toFixed(b - a > 1 ? 1 : 2));
        s.style.left = (k * 25) + "%";
        if (k === 0) s.style.transform = "none";  // the end labels stay inside the plot's width
        if (k === 4) s.style.transform = "translateX(-100%)";
        axis.appendChild(s);
      }
    });
    var status = document.getElementById("tl-status");
    status.textContent = label || "";
  }
  function pointAt(wrap, clientX) {
    var r = wrap.getBoundingClientRect();
    var f = Math.min(1, Math.max(0, (clientX - r.left) / r.width));
    return view[0] + f * (view[1] - view[0]);
  }
  function hover(run, wrap, e) {
    var x = pointAt(wrap, e.clientX), i = index(run.x, x);
    root.querySelectorAll(".tl-cursor").forEach(function (c) {
      c.style.display = "block";
      c.style.left = ((x - view[0]) / (view[1] - view[0]) * 100) + "%";
    });
    tip.textContent = "";
    var total = 0, rows = el("table");
    data.categories.forEach(function (c, j) {
      var b = run.bytes[j][i];
      total += b;
      if (!b) return;
      var tr = el("tr"), sw = el("span", "", "tl-swatch");
      sw.style.background = data.colors[j];
      var name = el("td");
      name.appendChild(sw);
      name.appendChild(document.createTextNode(c.replace("_", " ")));
      tr.appendChild(name);
      tr.appendChild(el("td", fmt(b)));
      rows.appendChild(tr);
    });
    tip.appendChild(el("b", run.name));
    tip.appendChild(el("div", "step " + Math.floor(run.x[i]) + ", " + run.phases[run.phase[i]] + " phase"));
    tip.appendChild(el("div", "live: " + fmt(total)));
    if (run.module) tip.appendChild(el("div", "module: " + run.modules[run.module[i]]));
    tip.appendChild(rows);
    tip.style.display = "block";
    var left = e.clientX + 14, top = e.clientY + 14;
    if (left + tip.offsetWidth > window.innerWidth) left = e.clientX - tip.offsetWidth - 14;
    if (top + tip.offsetHeight > window.innerHeight) top = e.clientY - tip.offsetHeight - 14;
    tip.style.left = left + "px";
    tip.style.top = top + "px";
    root.setAttribute("data-hover", run.name + "@" + i);
  }
  root.querySelectorAll(".tl-row").forEach(function (row) {
    var run = data.runs[Number(row.getAttribute("data-run"))], wrap = row.querySelector(".tl-plotwrap");
    wrap.addEventListener("mousemove", function (e) { hover(run, wrap, e); });
    wrap.addEventListener("mouseleave", function () {
      tip.style.display = "none";
      root.querySelectorAll(".tl-cursor").forEach(function (c) { c.style.display = "none"; });
    });
    wrap.addEventListener("click", function (e) {  // zoom to the step clicked; in a step already: back out
      var step = Math.min(data.steps - 1, Math.floor(pointAt(wrap, e.clientX)));
      if (view[1] - view[0] === 1) setView(0, data.steps, "all steps");
      else setView(step, step + 1, "step " + step + " (click again, or 'all steps', to zoom out)");
    });
  });
  root.querySelectorAll(".tl-controls button").forEach(function (btn) {
    btn.addEventListener("click", function () {
      var v = btn.getAttribute("data-view").split("-").map(Number);
      setView(v[0], v[1], btn.textContent);
    });
  });
  setView(0, data.steps, "");
  root.setAttribute("data-ready", "true");
})();
"""


def _json_for_script(value) -> str:
    """JSON safe inside a <script> element: no '<' (so no '</script>'), '>' or '&' from a result's text."""
    text = json.dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _area(xs: list[float], tops: list[int], scale: float, end: float) -> str:
    """A step-post area from 0 up to `tops`, as one compact path (H/V commands, integer units)."""
    ys = [round(YS - t * scale) for t in tops]
    parts = [f"M0 {YS}V{ys[0]}"]
    last_y = ys[0]
    for x, y in zip(xs[1:], ys[1:]):
        if y != last_y:
            parts.append(f"H{round(x * XS)}V{y}")
            last_y = y
    parts.append(f"H{round(end * XS)}V{YS}Z")
    return "".join(parts)


def _row(i: int, result: RunRecord, t: Timeline, top: float) -> str:
    scale = YS / top
    steps = t.steps
    # Cumulative tops, drawn from the last category down: each area covers those below it, one path each.
    used = [c for c in CATEGORIES if any(t.bytes[c])]
    cumulative, running = {}, [0] * len(t.x)
    for c in used:
        running = [a + b for a, b in zip(running, t.bytes[c])]
        cumulative[c] = running
    areas = "".join(f'<path fill="{COLORS[c]}" d="{_area(t.x, cumulative[c], scale, steps)}">'
                    f"<title>{_E(c.replace('_', ' '))}</title></path>" for c in reversed(used))
    band = "".join(f'<rect x="{round(s.start * XS)}" y="0" width="{max(1, round((s.end - s.start) * XS))}" '
                   f'height="10" fill="{PHASE_COLORS.get(s.phase, "#f4f4f4")}">'
                   f'<title>{_E(s.phase)}</title></rect>' for s in t.spans)
    steps_lines = "".join(f'<line x1="{k * XS}" x2="{k * XS}" y1="0" y2="{YS}" stroke="#000" stroke-dasharray="4 3" '
                          'vector-effect="non-scaling-stroke"/>' for k in range(1, steps))
    peak = t.peak
    px, py = round(peak.x * XS), round(YS - peak.bytes * scale)
    peak_line = (f'<line x1="{px}" x2="{px}" y1="{py}" y2="{YS}" stroke="#000" stroke-width="1.5" '
                 'vector-effect="non-scaling-stroke"/>')
    unit, size = unit_for(top)
    ticks = "".join(f'<span style="top:{12 + (1 - v * size / top) * 178:.1f}px">{v:g} {unit}</span>'
                    for v in round_ticks(top / size))
    view = f"0 0 {steps * XS}"
    # The timeline is a pass of its own after the measured steps, counted from 1 here: say which of its steps,
    # so the number is not read as the measured peak's step (counted with the warm-up steps, from 0).
    headline = f"peak {fmt_bytes(peak.bytes)} in {peak.phase}, timeline step {peak.step + 1} of {steps}"
    return f"""<div class="tl-row" data-run="{i}">
<div class="tl-name">{_E(result.name)} <span>{_E(headline)}</span></div>
<div class="tl-yaxis">{ticks}</div>
<div class="tl-plotwrap"><svg class="tl-band" data-h="10" viewBox="{view} 10" preserveAspectRatio="none">{band}</svg>
<svg class="tl-plot" data-h="{YS}" viewBox="{view} {YS}" preserveAspectRatio="none" role="img"
 aria-label="memory timeline of {_E(result.name, quote=True)}">{areas}{steps_lines}{peak_line}</svg>
<div class="tl-cursor"></div></div>
<div class="tl-xaxis"></div>
</div>"""


def _data(runs: list[tuple[RunRecord, Timeline]], steps: int) -> dict:
    return {"xs": XS, "steps": steps, "categories": list(CATEGORIES), "colors": [COLORS[c] for c in CATEGORIES],
            "runs": [{"name": r.name, "x": t.x, "bytes": [t.bytes[c] for c in CATEGORIES],
                      "phases": t.phases, "phase": t.phase, "modules": t.modules,
                      "module": t.module} for r, t in runs]}


def _legend() -> str:
    cats = "".join(f'<span><span class="tl-swatch" style="background:{COLORS[c]}"></span>{_E(c.replace("_", " "))}'
                   "</span>" for c in CATEGORIES)
    phases = "".join(f'<span><span class="tl-swatch" style="background:{PHASE_COLORS[p]}"></span>{p} phase</span>'
                     for p in ("forward", "backward", "optimizer"))
    return f'<div class="tl-legend">{cats}</div><div class="tl-legend">band above each row: {phases}</div>'


def render(results: list[RunRecord]) -> str:
    """The timeline section (HTML with its inline data and script), or '' when no run has a timeline."""
    runs = [(r, t) for r in results if r.status == "ok" and r.peak for t in [load_timeline(r)] if t is not None]
    runs.sort(key=lambda rt: not rt[0].is_baseline)
    if not runs:
        return ""
    top = max(t.peak.bytes for _, t in runs) * HEADROOM
    steps = max(t.steps for _, t in runs)
    buttons = "".join(f'<button type="button" data-view="{k}-{k + 1}">step {k}</button>' for k in range(steps))
    rows = "\n".join(_row(i, r, t, top) for i, (r, t) in enumerate(runs))
    return f"""<section id="timeline" data-view="0-{steps}">
<p class="muted">Live tensor memory over the {steps} recorded steps, one run per row on one y axis, stacked by
category; the band above each row is the phase, the dashed lines are step boundaries and the black line the peak.
Hover for the bytes by category and the module running at that point; click a step, or a button, to zoom to it.</p>
{_legend()}
<div class="tl-controls"><button type="button" data-view="0-{steps}">all steps</button>{buttons}
<span id="tl-status" class="muted"></span></div>
{rows}
<div id="tl-tip" role="tooltip"></div>
<script type="application/json" id="tl-data">{_json_for_script(_data(runs, steps))}</script>
<script>{SCRIPT}</script>
</section>"""
