"""The comparison table: each run's peak and throughput, and the change against the baseline.

One table per sweep (workload, batch size, device): runs of different sweeps never share a "vs base" column.
Memory is shown in one unit per table, picked from its magnitudes; step times with their noise, and a throughput
change that is within noise says so.
"""

from __future__ import annotations

from tabulate import tabulate

from membench.common.units import ByteFormat, fmt_bytes, pct_change
from membench.common.vocab import CATEGORIES
from membench.report import noise
from membench.report.explain import breakdown, find_baseline
from membench.results import RunRecord


def sweeps(results: list[RunRecord]) -> list[list[RunRecord]]:
    """Results grouped by sweep (workload, batch size, device, measured or predicted), in first-seen order."""
    groups: dict[tuple, list[RunRecord]] = {}
    for r in results:
        groups.setdefault(r.sweep_key, []).append(r)
    return list(groups.values())


def sweep_title(results: list[RunRecord]) -> str:
    workload, batch, device, predicted, loop = results[0].sweep_key
    loop_text = f", {loop}" if loop else ""
    return f"{workload}, batch {batch}, {device}{loop_text}" + (" (predicted)" if predicted else "")


def equivalence_text(r: RunRecord) -> str:
    eq = r.equivalence
    if eq is None:
        return "-"
    return eq.verdict + (f" (apart from {eq.apart_from})" if eq.apart_from else "")


def reference_note(results: list[RunRecord]) -> str | None:
    """Why there are no deltas, when the baseline cannot be the reference."""
    base = next((r for r in results if r.name == "baseline"), None)
    if base is None:
        return "no baseline in these results: absolute numbers only"
    if base.status != "ok":
        return (f"the baseline did not finish ({base.status}): its numbers are partial and cannot be a reference, "
                "so no change against it is shown (absolute numbers only)")
    return None


def rows(results: list[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """The table of one sweep (see `sweeps`)."""
    predicted = all(r.predicted for r in results)
    mixed = not predicted and any(r.predicted for r in results)  # never let a prediction pass for a measurement
    base = find_baseline(results)
    mem = ByteFormat([v for r in results if r.memory for v in (r.memory.peak_allocated_bytes,
                                                                r.memory.peak_reserved_bytes)])
    headers = ["run", "workload", "status", ("predicted" if predicted else "peak") + f" alloc {mem.unit}", "vs base",
               "peak phase", ("predicted " if predicted else "") + f"reserved {mem.unit}", "step ms ±CI",
               "throughput", "vs base", "equivalence"]
    body = []
    for r in results:
        m, t = r.memory, r.timing
        peak_delta = "-"
        if base is not None and m is not None and r.status == "ok":
            peak_delta = f"{pct_change(m.peak_allocated_bytes, base.peak):+.1f}%"
        body.append([
            r.name + (" (predicted)" if mixed and r.predicted else ""),
            r.label,
            r.status,
            mem(m.peak_allocated_bytes) if m else "-",
            peak_delta,
            (m.peak_phase if m else None) or "-",
            mem(m.peak_reserved_bytes) if m else "-",
            noise.step_ms(t),
            f"{t.throughput:.1f} {t.unit}" if t and t.throughput else "-",
            noise.delta(t, base.timing) if base is not None and r.status == "ok" else "-",
            equivalence_text(r),
        ])
    return headers, body


MARKDOWN_FORMATS = frozenset({"github", "pipe"})
# Markdown renders raw HTML and links: text from result files (names, workloads, errors) is shown, never run.
_MARKDOWN_INERT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]"})


def inert_markdown(text: object) -> str:
    """Text as markdown shows it and nothing more: no HTML element (`<script>`), no link (`[x](javascript:)`)."""
    return str(text).translate(_MARKDOWN_INERT)


def tabulated(headers: list[str], body: list[list[str]], fmt: str = "simple") -> str:
    """A table as text; cells are already formatted (numbers as strings: tabulate must not re-read them)."""
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def render(results: list[RunRecord], fmt: str = "simple") -> str:
    """One table per sweep, each titled when there are several; notes on what could not be compared."""
    groups = sweeps(results)
    parts = []
    for group in groups:
        text = tabulated(*rows(group), fmt)
        if len(groups) > 1:
            text = f"{sweep_title(group)}:\n{text}"
        note = reference_note(group)
        if note:
            text += f"\nnote: {note}"
        parts.append(text)
    if len(groups) > 1:
        parts.append(f"note: {len(groups)} sweeps (different workload, batch size or device) are shown apart; "
                     "runs are only compared within a sweep")
    text = "\n\n".join(parts)
    return inert_markdown(text) if fmt in MARKDOWN_FORMATS else text


BREAKDOWN_HEADERS = ["run", "peak", "peak phase"] + [c.replace("_", " ") for c in CATEGORIES]


def breakdown_rows(results: list[RunRecord]) -> list[list[str]]:
    """Each run's peak and its make-up by category (one unit for the table), the table that explains the peak."""
    fmt = ByteFormat([r.peak for r in results] + [v for r in results for v in (breakdown(r) or {}).values()],
                     max_decimals=2)
    body = []
    for r in results:
        parts = breakdown(r) or {}
        body.append([r.name, fmt.with_unit(r.peak), (r.memory.peak_phase if r.memory else None) or "-"]
                    + [fmt.with_unit(parts[c]) if c in parts else "-" for c in CATEGORIES])
    return body


def module_phrase(m) -> str:
    """'blocks.3.mlp: 412.00 MiB activations' (one ModuleBytes)."""
    return f"{m.module}: {fmt_bytes(m.bytes)} {m.category.replace('_', ' ')}"


def top_modules_text(result: RunRecord, n: int = 5) -> str | None:
    """Where a run's peak comes from, for the terminal: its n largest (module, category) at the peak."""
    top = result.memory.top_modules if result.memory else None
    if not top:
        return None
    width = max(len(m.module) for m in top[:n])
    lines = [f"  {m.module:<{width}}  {fmt_bytes(m.bytes):>11}  {m.category.replace('_', ' ')}" for m in top[:n]]
    share = sum(m.bytes for m in top[:n]) / result.peak * 100 if result.peak else 0
    return "\n".join([f"where {result.name}'s peak ({fmt_bytes(result.peak)}, {result.memory.peak_phase}) comes "
                      f"from, top {min(n, len(top))} modules ({share:.0f}% of it):", *lines])
