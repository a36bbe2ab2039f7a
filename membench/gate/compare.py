"""`membench compare OLD NEW`: the same runs before and after a change, side by side, with deltas.

Runs pair by what ran (their RunSpec: workload, batch size, techniques, device, ...), the rule `membench check`
uses, never by name alone: vit-small at batch 1 is not "the baseline" of vit-tiny at batch 4. Runs without a
partner are listed apart, with the reason. The two sides ran apart (before and after a change): a throughput
change is shown only where their intervals are apart, and says "separate runs" (a change of the machine's load
between them is in neither interval).
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.errors import UserError
from membench.common.units import ByteFormat, fmt_number, pct_change
from membench.report import noise
from membench.report.table import MARKDOWN_FORMATS, fold, inert_markdown, tabulated
from membench.results import RunRecord
from membench.results.sweep import Sweep
from membench.techniques import pairing_key


@dataclass(frozen=True)
class Pair:
    """A run before (old) and after (new) a change, with the same run spec."""

    old: RunRecord
    new: RunRecord


def pairs(old: list[RunRecord], new: list[RunRecord]) -> tuple[list[Pair], list[str]]:
    """Pairs with the same run spec (techniques.pairing_key), sweep by sweep; and a note for each run without a
    partner."""
    by_spec = {pairing_key(r.spec.run): r for r in old}
    matched, notes, used = [], [], set()
    for sweep in Sweep.group(new):
        for b in sweep.runs:
            a = by_spec.get(pairing_key(b.spec.run))
            if a is None:
                same_name = [r for r in old if r.name == b.name]
                why = (f"; OLD's {b.name} is {same_name[0].label}" if same_name else "")
                notes.append(f"not compared: NEW's {b.name} ({b.label}) has no run with the same spec in OLD{why}")
                continue
            matched.append(Pair(a, b))
            used.add(pairing_key(b.spec.run))
    for a in old:
        if pairing_key(a.spec.run) not in used:
            notes.append(f"not compared: OLD's {a.name} ({a.label}) has no run with the same spec in NEW")
    return matched, notes


def _peak(r: RunRecord) -> int | None:
    return r.memory.peak_allocated_bytes if r.memory else None


def _phase(r: RunRecord) -> str:
    return (r.memory.peak_phase if r.memory else None) or "-"


def _throughput(r: RunRecord) -> str:
    t = r.timing
    return f"{fmt_number(t.throughput)} {t.unit or ''}".strip() if t and t.throughput else "-"


def table(old: list[RunRecord], new: list[RunRecord]) -> tuple[list[str], list[list[str]], list[str]]:
    """(headers, one row per pair, notes). Units are picked from this table's values (the deltas separately)."""
    matched, notes = pairs(old, new)
    peaks = [(_peak(p.old), _peak(p.new)) for p in matched]
    fmt = ByteFormat([v for pair in peaks for v in pair])
    deltas = [pb - pa if pa is not None and pb is not None else None for pa, pb in peaks]
    delta_fmt = ByteFormat(deltas)
    body = [[p.new.name, p.new.label, f"{p.old.status}/{p.new.status}", fmt(pa), fmt(pb), delta_fmt(d, sign=True),
             f"{pct_change(pb, pa):+.1f}%" if pb is not None and pa else "-", f"{_phase(p.old)} → {_phase(p.new)}",
             _throughput(p.old), _throughput(p.new), noise.separate_runs_delta(p.new.timing, p.old.timing)]
            for p, (pa, pb), d in zip(matched, peaks, deltas)]
    headers = ["run", "workload", "status old/new", f"peak {fmt.unit} old", f"peak {fmt.unit} new",
               f"Δ peak {delta_fmt.unit}", "Δ peak %", "peak phase old → new", "throughput old", "throughput new",
               "Δ throughput % (separate runs)"]
    return headers, body, notes


def render(old: list[RunRecord], new: list[RunRecord], fmt: str = "simple") -> str:
    head, body, notes = table(old, new)
    if not body:
        have = sorted({f"{r.name} ({r.label})" for r in old})
        got = sorted({f"{r.name} ({r.label})" for r in new})
        raise UserError("nothing comparable: no run in NEW has the workload spec of a run in OLD (OLD: "
                        f"{', '.join(have)}; NEW: {', '.join(got)})")
    parts = [(head, body)] if fmt in MARKDOWN_FORMATS else fold(head, body)
    text = "\n\n".join(tabulated(h, b, fmt) for h, b in parts)
    text = "\n".join([text, *notes]) if notes else text
    return inert_markdown(text) if fmt in MARKDOWN_FORMATS else text
