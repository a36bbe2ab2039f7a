"""A run's prediction beside its measurement (results.PredictionCheck, made by predict/beside.py), in words: the
lines `membench run` prints under the run's line, and the HTML report's section."""

from __future__ import annotations

import html

from membench.common.units import fmt_bytes, fmt_bytes_apart
from membench.results import AllocationSide, PredictionCheck


def _pair(what: str, predicted: int | None, measured: int | None, error: float | None) -> str | None:
    if predicted is None or measured is None:
        return None
    p, m = fmt_bytes_apart(predicted, measured)
    text = f"{what} {p} predicted, {m} measured"
    if error is not None:
        text += " (the same bytes)" if predicted == measured else f" ({error:+.2%})"
    return text


def side_phrase(side: AllocationSide) -> str:
    if side.kind is None:
        return "nothing (its step had ended)"
    text = f"{side.kind} of {fmt_bytes(side.size)}" if side.size is not None else side.kind
    if side.category:
        text += f" ({side.category}"
        text += f", module {side.module})" if side.module else ")"
    if side.site:
        text += f" at {side.site}"
    return text


def prediction_lines(check: PredictionCheck | None) -> list[str]:
    """What `membench run` prints under a run's line: the prediction for the device it ran on beside the
    measurement, and where they part ways when they differ by more than the tolerance. [] without a check."""
    if check is None:
        return []
    if check.status != "ok":
        return [f"prediction for {check.target}: {check.status}: {check.detail}"]
    pairs = [p for p in (
        _pair("peak allocated", check.predicted_peak_allocated_bytes, check.measured_peak_allocated_bytes,
              check.allocated_error),
        _pair("reserved", check.predicted_peak_reserved_bytes, check.measured_peak_reserved_bytes,
              check.reserved_error)) if p]
    verdict = ("within" if check.within else "outside") + (
        " the tolerance (0: the same bytes)" if not check.tolerance else f" the tolerance ({check.tolerance:.0%})")
    lines = [f"prediction for {check.target}: {'; '.join(pairs)}: {verdict}"]
    if check.divergence is not None:
        d = check.divergence
        lines.append(f"first difference, after {d.index} allocations and frees the same on both sides: predicted "
                     f"{side_phrase(d.predicted)}; measured {side_phrase(d.measured)}")
    if check.detail:
        lines.append(check.detail)
    if check.hint:
        lines.append(check.hint)
    return lines


def prediction_html(check: PredictionCheck | None) -> str:
    """The HTML report's paragraph for a run's prediction: the same lines as the terminal's, escaped."""
    lines = prediction_lines(check)
    if not lines:
        return ""
    css = "" if check.status == "ok" and check.within else ' class="verdict-not-equivalent"'
    head, rest = html.escape(lines[0]), "".join(f"<br>{html.escape(line)}" for line in lines[1:])
    return f"<p{css}>Predicted beside measured: {head}{rest}</p>"
