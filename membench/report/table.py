"""The comparison table: each run's peak and throughput, and the change against the baseline."""

from __future__ import annotations

import math

from tabulate import tabulate

from membench.results import to_frame


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(value, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    return "-" if _missing(value) else format(value * scale, fmt) + suffix


def rows(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    df = to_frame(results)
    predicted = bool(df["predicted"].all())
    mixed = not predicted and bool(df["predicted"].any())  # never let a prediction pass for a measurement
    headers = ["run", "status", ("predicted" if predicted else "peak") + " alloc GiB", "vs base", "peak phase",
               "reserved GiB", "step ms", "throughput", "vs base", "equivalence"]
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


def render(results: list[dict], fmt: str = "simple") -> str:
    headers, body = rows(results)
    return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)
