"""The report's charts (matplotlib, Agg, no pyplot state): each saved as PNG and SVG.

- peak memory by technique, stacked by category at the peak, the baseline's peak marked;
- timelines side by side on one y axis and one step scale: stacked areas by category, phases shaded;
- memory vs throughput with the Pareto front (nothing else is both smaller and faster).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from membench.common import units
from membench.common.errors import UserError
from membench.common.fsio import atomic_write_bytes, atomic_write_text, make_dir, read_bounded, side_file
from membench.common.vocab import CATEGORIES
from membench.report import noise
from membench.report.view import SweepView
from membench.results import RunRecord
from membench.results.sweep import Sweep
from membench.results.timeline import Timeline, parse_timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Categories: the Okabe-Ito palette (told apart with the common colour-vision deficiencies), recomputed
# activations a lighter shade of activations. Phases: greys only, so a phase never looks like a category (green
# optimizer state on a green optimizer phase did).
COLORS = {"parameters": "#0072B2", "gradients": "#E69F00", "optimizer_state": "#009E73",
          "activations": "#D55E00", "recomputed_activations": "#F0B48A", "temporaries": "#CC79A7",
          "inputs": "#56B4E9", "other": "#999999"}
PHASE_COLORS = {"inputs": "#f7f7f7", "forward": "#e6e6e6", "backward": "#c4c4c4", "optimizer": "#8f8f8f"}


def _matplotlib():
    """(Figure, Patch), imported when a chart is drawn: a report without charts, and the timeline page's colours,
    start without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    return Figure, Patch


def _text(value) -> str:
    """Text from a result file, shown as it is: matplotlib would read $...$ as math (and fail on a bad one)."""
    return str(value).replace("$", r"\$")


def unit_for(nbytes: float) -> tuple[str, int]:
    """The largest binary unit in which the biggest value is at least 1 (labels say which): as the tables pick."""
    return units.unit_for([nbytes])


def save(fig: Figure, out_dir: Path, name: str) -> dict:
    """Write name.png and name.svg; return their paths and the SVG text (for inlining in HTML)."""
    make_dir(out_dir)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    png_bytes = io.BytesIO()
    fig.savefig(png_bytes, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    atomic_write_bytes(png, png_bytes.getvalue())
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    atomic_write_text(svg, buf.getvalue())
    return {"png": png, "svg": svg, "svg_text": buf.getvalue()}


def _ok(sweep: Sweep) -> list[RunRecord]:
    return [r for r in sweep.runs if r.status == "ok" and r.peak]


def peak_chart(v: SweepView) -> Figure | None:
    sweep = v.sweep
    runs = _ok(sweep)
    parts = {r.record.name: r.parts() or {} for r in v.runs}
    if not runs:
        return None
    peaks = [r.peak for r in runs]
    unit, scale = unit_for(max(peaks))
    Figure, Patch = _matplotlib()
    fig = Figure(figsize=(max(5.0, 1.1 * len(runs) + 2.5), 4.2))
    ax = fig.subplots()
    names = [_text(r.name) for r in runs]
    xs = range(len(runs))
    bottoms = [0.0] * len(runs)
    for c in CATEGORIES:
        heights = [parts[r.name].get(c, 0) / scale for r in runs]
        if any(heights):
            ax.bar(xs, heights, 0.6, bottom=bottoms, color=COLORS[c], label=c.replace("_", " "))
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    # A run without a breakdown (or a CUDA peak above its 512 B-rounded breakdown): the rest, uncategorised.
    rest = [max(0.0, p / scale - b) if b == 0 else 0.0 for p, b in zip(peaks, bottoms)]
    if any(rest):
        ax.bar(xs, rest, 0.6, bottom=bottoms, color="#cccccc", hatch="//", label="not categorised")
    for x, p in zip(xs, peaks):
        ax.text(x, p / scale, f"{p / scale:.3g}", ha="center", va="bottom", fontsize=8)
    base = sweep.reference
    if base:
        ax.axhline(base.peak / scale, color="black", ls="--", lw=1, label="baseline peak")
    ax.set_xticks(list(xs), names, rotation=20, ha="right")
    ax.set_ylabel(f"peak allocated ({unit})")
    ax.set_title("Peak memory by technique, by category at the peak")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_ylim(0, max(peaks) / scale * 1.12)
    return fig


def load_timeline(result: RunRecord) -> Timeline | None:
    """The run's timeline, if its result names a readable one: a regular file in the result's folder, of at most
    fsio.MAX_SIDE_FILE_BYTES (a crafted name never reads /dev/zero or a file elsewhere), that the typed reader
    takes. A file of another shape is a crafted or foreign one: no chart for that run, rather than a failed
    report."""
    info = result.timeline
    if info is None or result.path is None:
        return None
    path = side_file(result.path.parent, info.file)
    data = read_bounded(path) if path is not None else None
    if data is None:
        return None
    try:
        return parse_timeline(data.decode(), str(path))
    except (UserError, UnicodeDecodeError):
        return None


def timeline_chart(sweep: Sweep) -> Figure | None:
    """Baseline first, then each technique: same y axis, same step scale, stacked by category."""
    runs = [(r, t) for r in _ok(sweep) for t in [load_timeline(r)] if t is not None]
    if not runs:
        return None
    top = max(t.peak.bytes for _, t in runs)
    unit, scale = unit_for(top)
    cols = min(len(runs), 4)
    rows = -(-len(runs) // cols)
    Figure, Patch = _matplotlib()
    fig = Figure(figsize=(4.2 * cols, 3.3 * rows + 0.6))
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, (result, t) in zip(axes, runs):
        for span in t.spans:
            ax.axvspan(span.start, span.end, color=PHASE_COLORS.get(span.phase, "#f4f4f4"), lw=0)
        ys = [[v / scale for v in t.bytes[c]] for c in CATEGORIES]
        # Rasterized: thousands of points x 7 categories as SVG paths would make megabytes; axes stay vector.
        ax.stackplot(t.x, *ys, colors=[COLORS[c] for c in CATEGORIES], step="post",
                     labels=[c.replace("_", " ") for c in CATEGORIES], rasterized=True)
        peak = t.peak
        ax.plot([peak.x], [peak.bytes / scale], "kv", ms=6)
        ax.annotate(f"peak {peak.bytes / scale:.3g} {unit}\n({_text(peak.phase)})",
                    (peak.x, peak.bytes / scale), xytext=(4, 4), textcoords="offset points", fontsize=7)
        for step in range(1, t.steps):
            ax.axvline(step, color="black", lw=0.6, ls=":")
        ax.set_title(_text(result.name), fontsize=10)
        ax.set_xlim(0, t.steps)
        ax.set_ylim(0, top / scale * 1.2)
    for ax in axes[len(runs):]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel(f"live tensors ({unit})")
    fig.supxlabel("training step of the recording pass (shaded: the phase; triangle: the peak)", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    phase_handles = [Patch(color=PHASE_COLORS[p], label=f"{p} phase")
                     for p in ("forward", "backward", "optimizer")]
    fig.legend(handles[::-1] + phase_handles, labels[::-1] + [h.get_label() for h in phase_handles],
               loc="center left", fontsize=7, bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("Memory timeline by category, baseline vs each technique")
    fig.tight_layout()
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both memory (lower) and throughput (higher)."""
    front = []
    for i, (m, t) in enumerate(points):
        dominated = any((m2 <= m and t2 >= t) and (m2 < m or t2 > t) for j, (m2, t2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def label_offsets(points: list[tuple[float, float]], near: float = 0.08, line_pt: int = 11) -> list[int]:
    """Vertical offsets (points) for one label per point, so that labels of points close together (within `near`
    of each axis's range) stack one line apart instead of printing over each other."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    placed: list[tuple[float, float, int]] = []
    offsets = [0] * len(points)
    for i in sorted(range(len(points)), key=lambda k: (points[k][1], points[k][0])):
        x, y = (points[i][0] - min(xs)) / span_x, (points[i][1] - min(ys)) / span_y
        used = {o for px, py, o in placed if abs(px - x) < near and abs(py - y) < near}
        offsets[i] = next(4 + k * line_pt for k in range(len(points) + 1) if 4 + k * line_pt not in used)
        placed.append((x, y, offsets[i]))
    return offsets


def pareto_chart(sweep: Sweep) -> Figure | None:
    """Peak (exact) against throughput, with each run's throughput interval as an error bar (each run timed on
    its own: the table's "speed vs base" is the comparison that cancels a change of load). Runs that change
    precision are marked: not the same model."""
    runs = [r for r in _ok(sweep) if r.timing and r.timing.throughput]
    if not runs:
        return None
    points = [(r.peak, r.timing.throughput) for r in runs]
    unit, scale = unit_for(max(m for m, _ in points))
    Figure, _ = _matplotlib()
    fig = Figure(figsize=(6, 4.2))
    ax = fig.subplots()
    front = pareto_front(points)
    ax.plot([points[i][0] / scale for i in front], [points[i][1] for i in front], "-", color="#55A868", lw=1.5,
            label="Pareto front", zorder=1)
    marked_precision = False
    offsets = label_offsets(points)
    for i, (r, (m, t)) in enumerate(zip(runs, points)):
        on_front = i in front
        color = "#55A868" if on_front else "#888888"
        interval = noise.throughput_interval(r.timing)
        if interval is not None:
            # clipped at 0: a crafted median outside its own interval draws no bar that way, never a traceback
            ax.errorbar([m / scale], [t], yerr=[[max(0.0, t - interval[0])], [max(0.0, interval[1] - t)]],
                        fmt="none", ecolor=color, elinewidth=1, capsize=3, zorder=1.5)
        precision = r.changes_precision
        marker = "*" if r.is_baseline else "D" if precision else "o"
        ax.scatter([m / scale], [t], s=50 if on_front else 30, color=color, marker=marker, zorder=2,
                   edgecolors="#b42318" if precision else "none",
                   label="changes precision (not the same model)" if precision and not marked_precision else None)
        marked_precision = marked_precision or precision
        ax.annotate(_text(r.name) + (" (precision)" if precision else ""), (m / scale, t), xytext=(5, offsets[i]),
                    textcoords="offset points", fontsize=8)
    ax.set_xlabel(f"peak allocated ({unit})")
    ax.set_ylabel(f"throughput ({_text(runs[0].timing.unit or 'samples/s')}; bars: CI of the median)")
    # The bars come from each run's own timed steps, runs timed apart (a change of load between them is in no
    # bar): the table's "speed vs base" is the interleaved comparison, and the chart says it is not that.
    ax.set_title("Memory vs throughput, each run timed apart\n(the table's speed vs base is timed in alternation)")
    ax.legend(fontsize=8)
    ax.margins(0.15)
    return fig


def write_all(v: SweepView, out_dir: Path) -> dict[str, dict]:
    """Every chart that has data, saved under out_dir; name -> save() output. Drawn from the sweep's view (the peak
    chart's categories are the tables'); the timelines and the throughputs are each run's own records."""
    charts = {}
    for name, make in (("peak", peak_chart), ("timelines", lambda v: timeline_chart(v.sweep)),
                       ("pareto", lambda v: pareto_chart(v.sweep))):
        fig = make(v)
        if fig is not None:
            charts[name] = save(fig, out_dir, name)
    return charts
