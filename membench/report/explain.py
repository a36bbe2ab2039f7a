"""What each technique did, in plain words, computed from the numbers (never from what it is supposed to do).

The reference tutorial reads its snapshots this way: which category of memory is gone at the peak and how much,
where the peak moved (forward, backward, optimizer step), what it cost in throughput, whether training is the same.
"""

from __future__ import annotations

from membench.common.units import fmt_bytes, fmt_bytes_apart, fmt_number, pct_change
from membench.common.vocab import CATEGORIES
from membench.report import noise
from membench.results import Equivalence, RunRecord, Timing

# A change smaller than this share of the baseline's peak is noise in a sentence (it stays in the tables).
MENTION_SHARE = 0.01

CATEGORY_WORDS = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
                  "activations": "activations", "recomputed_activations": "recomputed activations",
                  "temporaries": "temporaries", "inputs": "inputs",
                  "other": "other tensors"}
PHASE_WORDS = {"setup": "setup (between steps)", "inputs": "input copy", "forward": "forward",
               "backward": "backward", "optimizer": "optimizer step"}


def breakdown(result: RunRecord) -> dict[str, int] | None:
    """Bytes by category at the peak: the measured step's (CPU), else the recording pass's (CUDA, 512 B-rounded)."""
    if result.memory and result.memory.breakdown_at_peak:
        return result.memory.breakdown_at_peak
    return result.timeline.breakdown_at_peak if result.timeline else None


def peak_phase(result: RunRecord) -> str | None:
    return result.memory.peak_phase if result.memory else None


def find_baseline(results: list[RunRecord]) -> RunRecord | None:
    return next((r for r in results if r.name == "baseline" and r.status == "ok"), None)


def _phase(name: str | None) -> str:
    return PHASE_WORDS.get(name, name or "unknown")


def explain(result: RunRecord, baseline: RunRecord | None) -> list[str]:
    """Sentences about one run against the baseline."""
    name = result.name
    if result.status != "ok":
        return [f"{name} did not finish ({result.status}): {result.error or 'no detail'}."]
    peak = result.peak
    if baseline is None or result is baseline:
        lines = [f"The peak is {fmt_bytes(peak)}, in the {_phase(peak_phase(result))} phase."]
        parts = breakdown(result)
        if parts and peak:
            top = sorted(((v, c) for c, v in parts.items() if v > 0), reverse=True)[:4]
            lines.append("At the peak: " + ", ".join(f"{CATEGORY_WORDS.get(c, c)} {fmt_bytes(v)}" for v, c in top)
                         + ".")
        return lines
    base_peak = baseline.peak
    lines = []
    if peak and base_peak and peak == base_peak:
        lines.append(f"{name} leaves the peak unchanged at {fmt_bytes(peak)} (to the byte).")
    elif peak and base_peak:
        change = pct_change(peak, base_peak)
        verb = "lowers" if peak < base_peak else "raises"
        before, after = fmt_bytes_apart(base_peak, peak)
        lines.append(f"{name} {verb} the peak from {before} to {after} ({change:+.1f}%, "
                     f"{fmt_bytes(abs(peak - base_peak))} {'saved' if peak <= base_peak else 'more'}).")
    lines.extend(_categories(breakdown(result), breakdown(baseline), base_peak))
    old_phase, new_phase = peak_phase(baseline), peak_phase(result)
    if old_phase and new_phase:
        if old_phase == new_phase:
            lines.append(f"The peak stays in the {_phase(new_phase)} phase.")
        else:
            lines.append(f"The peak moves from the {_phase(old_phase)} phase to the {_phase(new_phase)} phase.")
    lines.extend(_throughput(result.timing, baseline.timing))
    lines.extend(_equivalence(result.equivalence))
    return lines


def _categories(parts: dict | None, base_parts: dict | None, base_peak: int | None) -> list[str]:
    if not parts or not base_parts or not base_peak:
        return ["No breakdown by category for this run (no timeline recorded)."]
    deltas = [(parts.get(c, 0) - base_parts.get(c, 0), c) for c in CATEGORIES]
    threshold = MENTION_SHARE * base_peak
    removed = sorted((d, c) for d, c in deltas if d < -threshold)
    added = sorted(((d, c) for d, c in deltas if d > threshold), reverse=True)
    lines = []
    if removed:
        lines.append("At its peak it holds less " + ", less ".join(
            f"{CATEGORY_WORDS[c]} ({' to '.join(fmt_bytes_apart(base_parts.get(c, 0), parts.get(c, 0)))}, "
            f"-{fmt_bytes(-d)})" for d, c in removed) + " than the baseline at its peak.")
    if added:
        lines.append("It holds more " + ", more ".join(
            f"{CATEGORY_WORDS[c]} (+{fmt_bytes(d)})" for d, c in added) + ".")
    if not removed and not added:
        lines.append("The peak's make-up by category is the same as the baseline's (within 1% of its peak).")
    return lines


def _throughput(timing: Timing | None, base_timing: Timing | None) -> list[str]:
    value, base = timing and timing.throughput, base_timing and base_timing.throughput
    if not value or not base:
        return []
    change = pct_change(value, base)
    unit = timing.unit or ""
    if noise.within_noise(timing, base_timing):
        spreads = [s for s in (noise.spread(timing), noise.spread(base_timing)) if s is not None]
        how = (f"±{max(spreads):.0%}" if spreads else "no interval recorded")
        numbers = (f"({fmt_number(value)} vs {fmt_number(base)} {unit}, {change:+.1f}%; the step-time intervals "
                   f"overlap, {how})")
        if abs(change) < noise.UNDECIDED_AT_PCT:  # the table's rule (noise.delta): a small change is noise
            return [f"Its throughput is within noise of the baseline's {numbers}: no difference is shown as a fact."]
        return [f"Its throughput against the baseline's is undecided: {noise.RERUN} {numbers}: within noise, "
                "no difference is shown as a fact."]
    how = f"costs {-change:.1f}% of throughput" if change < 0 else f"runs {change:.1f}% faster"
    return [f"It {how} ({fmt_number(value)} vs {fmt_number(base)} {unit}; outside the noise: the step-time "
            "intervals do not overlap)."]


def _equivalence(eq: Equivalence | None) -> list[str]:
    if eq is None:
        return ["Numerical equivalence was not checked."]
    verdict = eq.verdict
    words = {"bitwise": "It trains bit for bit the same model as the baseline",
             "equivalent": "It trains the same model as the baseline up to floating-point rounding",
             "not-equivalent": "It does NOT train the same model as the baseline",
             "precision": "It changes the numerics on purpose"}.get(verdict, f"Equivalence: {verdict}")
    if eq.apart_from:
        words = f"It trains the same model as the baseline, apart from {eq.apart_from}"
    detail = eq.detail
    return [f"{words}{': ' + detail if detail else ''}."]


def explain_all(results: list[RunRecord]) -> dict[str, list[str]]:
    baseline = find_baseline(results)
    return {r.name: explain(r, baseline) for r in results}
