"""`membench compare OLD NEW`: the same runs before and after a change, side by side, with deltas.

Runs pair by what ran (their RunSpec: workload, batch size, techniques, device, ...), the rule `membench check`
uses, never by name alone: vit-small at batch 1 is not "the baseline" of vit-tiny at batch 4. Runs without a
partner are listed apart, with the reason.
"""

from __future__ import annotations

from membench.common.errors import UserError
from membench.common.units import ByteFormat, pct_change
from membench.report import noise
from membench.report.table import MARKDOWN_FORMATS, inert_markdown, tabulated
from membench.results import RunRecord
from membench.techniques import pairing_key


def _pct(new, old) -> str:
    return f"{pct_change(new, old):+.1f}%" if new is not None and old else "-"


def _get(result: RunRecord | None, section: str, key: str):
    part = getattr(result, section) if result is not None else None
    return getattr(part, key) if part is not None else None


def pairs(old: list[RunRecord], new: list[RunRecord]) -> tuple[list[tuple[RunRecord, RunRecord]], list[str]]:
    """(old, new) pairs with the same run spec (techniques.pairing_key); and a note for each run that has no partner."""
    by_spec = {pairing_key(r.spec.run): r for r in old}
    matched, notes, used = [], [], set()
    for b in new:
        a = by_spec.get(pairing_key(b.spec.run))
        if a is None:
            same_name = [r for r in old if r.name == b.name]
            why = (f"; OLD's {b.name} is {same_name[0].label}" if same_name else "")
            notes.append(f"not compared: NEW's {b.name} ({b.label}) has no run with the same spec in OLD{why}")
            continue
        matched.append((a, b))
        used.add(pairing_key(b.spec.run))
    for a in old:
        if pairing_key(a.spec.run) not in used:
            notes.append(f"not compared: OLD's {a.name} ({a.label}) has no run with the same spec in NEW")
    return matched, notes


def headers(fmt: ByteFormat, delta_fmt: ByteFormat) -> list[str]:
    return ["run", "workload", "status old/new", f"peak {fmt.unit} old", f"peak {fmt.unit} new",
            f"Δ peak {delta_fmt.unit}", "Δ peak %", "peak phase old → new", "throughput old", "throughput new",
            "Δ throughput %"]


def rows(old: list[RunRecord], new: list[RunRecord]) -> list[list[str]]:
    return table(old, new)[1]


def table(old: list[RunRecord], new: list[RunRecord]) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, one row per pair, notes). Units are picked from this table's values (the deltas separately)."""
    matched, notes = pairs(old, new)
    peaks = [(_get(a, "memory", "peak_allocated_bytes"), _get(b, "memory", "peak_allocated_bytes"))
             for a, b in matched]
    fmt = ByteFormat([v for p in peaks for v in p])
    deltas = [pb - pa if pa is not None and pb is not None else None for pa, pb in peaks]
    delta_fmt = ByteFormat(deltas)
    body = []
    for (a, b), (pa, pb), d in zip(matched, peaks, deltas):
        ta, tb = _get(a, "timing", "throughput"), _get(b, "timing", "throughput")
        unit = _get(b, "timing", "unit") or _get(a, "timing", "unit") or ""
        body.append([
            b.name, b.label, f"{a.status}/{b.status}",
            fmt(pa), fmt(pb), delta_fmt(d, sign=True), _pct(pb, pa),
            f"{_get(a, 'memory', 'peak_phase') or '-'} → {_get(b, 'memory', 'peak_phase') or '-'}",
            f"{ta:.1f} {unit}" if ta else "-", f"{tb:.1f} {unit}" if tb else "-",
            noise.delta(b.timing, a.timing) if ta and tb else "-",
        ])
    return headers(fmt, delta_fmt), body, notes


def render(old: list[RunRecord], new: list[RunRecord], fmt: str = "simple") -> str:
    head, body, notes = table(old, new)
    if not body:
        have = sorted({f"{r.name} ({r.label})" for r in old})
        got = sorted({f"{r.name} ({r.label})" for r in new})
        raise UserError("nothing comparable: no run in NEW has the workload spec of a run in OLD (OLD: "
                        f"{', '.join(have)}; NEW: {', '.join(got)})")
    text = tabulated(head, body, fmt)
    text = "\n".join([text, *notes]) if notes else text
    return inert_markdown(text) if fmt in MARKDOWN_FORMATS else text
