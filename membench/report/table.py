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
