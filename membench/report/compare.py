"""`membench compare OLD NEW`: the same runs before and after a change, side by side, with deltas."""

from __future__ import annotations

from membench.report.table import tabulated
from membench.results import RunRecord
from membench.units import gib, pct_change

HEADERS = ["run", "status old/new", "peak GiB old", "peak GiB new", "Δ peak", "Δ peak %", "peak phase old → new",
           "throughput old", "throughput new", "Δ throughput %"]


def _pct(new, old) -> str:
    return f"{pct_change(new, old):+.1f}%" if new is not None and old else "-"


def _get(result: RunRecord | None, section: str, key: str):
    part = getattr(result, section) if result is not None else None
    return getattr(part, key) if part is not None else None


def rows(old: list[RunRecord], new: list[RunRecord]) -> list[list[str]]:
    """One row per run name in either set (old order first); a run in only one set shows '-' for the other."""
    by_old = {r.name: r for r in old}
    by_new = {r.name: r for r in new}
    names = list(by_old) + [n for n in by_new if n not in by_old]
    body = []
    for name in names:
        a, b = by_old.get(name), by_new.get(name)
        pa, pb = _get(a, "memory", "peak_allocated_bytes"), _get(b, "memory", "peak_allocated_bytes")
        ta, tb = _get(a, "timing", "throughput"), _get(b, "timing", "throughput")
        unit = _get(b, "timing", "unit") or _get(a, "timing", "unit") or ""
        delta = f"{(pb - pa) / 2**30:+.4f}" if pa is not None and pb is not None else "-"
        body.append([
            name,
            f"{a.status if a else '-'}/{b.status if b else '-'}",
            gib(pa), gib(pb), delta, _pct(pb, pa),
            f"{_get(a, 'memory', 'peak_phase') or '-'} → {_get(b, 'memory', 'peak_phase') or '-'}",
            f"{ta:.1f} {unit}" if ta else "-", f"{tb:.1f} {unit}" if tb else "-", _pct(tb, ta),
        ])
    return body


def render(old: list[RunRecord], new: list[RunRecord], fmt: str = "simple") -> str:
    return tabulated(HEADERS, rows(old, new), fmt)
