"""The comparison table: each run's peak and throughput, and the change against the baseline."""

from __future__ import annotations

import math

from tabulate import tabulate

from membench.report.explain import breakdown
from membench.results import RunRecord, to_frame
from membench.units import fmt_bytes
from membench.vocab import CATEGORIES


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(value, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if _missing(value) else format(value * scale, fmt) + suffix


def rows(results: list[RunRecord]) -> tuple[list[str], list[list[str]]]:
    df = to_frame(results)
    predicted = bool(df["predicted"].all())
    mixed = not predicted and bool(df["predicted"].any())  # never let a prediction pass for a measurement
    headers = ["run", "status", ("predicted" if predicted else "peak") + " alloc GiB", "vs base", "peak phase",
               ("predicted " if predicted else "") + "reserved GiB", "step ms", "throughput", "vs base", "equivalence"]
    body = []
    for r in df.to_dict("records"):
        body.append([
            r["run"] + (" (predicted)" if mixed and r["predicted"] else ""),
            r["status"],
            _num(r["peak_allocated_bytes"], ".3f", 2**-30),
            _num(r["peak_vs_baseline_pct"], "+.1f", suffix="%"),
            r["peak_phase"] or "-",
            _num(r["peak_reserved_bytes"], ".3f", 2**-30),
            _num(r["median_step_s"], ".1f", 1e3),
            _num(r["throughput"], ".1f", suffix=f" {r['throughput_unit']}"),
            _num(r["throughput_vs_baseline_pct"], "+.1f", suffix="%"),
            r["equivalence"] or "-",
        ])
    return headers, body


def tabulated(headers: list[str], body: list[list[str]], fmt: str = "simple") -> str:
    """A table as text; cells are already formatted (numbers as strings: tabulate must not re-read them)."""
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)


def render(results: list[RunRecord], fmt: str = "simple") -> str:
    return tabulated(*rows(results), fmt)


BREAKDOWN_HEADERS = ["run", "peak", "peak phase"] + [c.replace("_", " ") for c in CATEGORIES]


def breakdown_rows(results: list[RunRecord]) -> list[list[str]]:
    """Each run's peak and its make-up by category (human units), the table that explains the peak."""
    body = []
    for r in results:
        parts = breakdown(r) or {}
        body.append([r.name, fmt_bytes(r.peak), (r.memory.peak_phase if r.memory else None) or "-"]
                    + [fmt_bytes(parts[c]) if c in parts else "-" for c in CATEGORIES])
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
