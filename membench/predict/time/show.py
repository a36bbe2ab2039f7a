"""What `membench predict` prints of the predicted step time: one line per run, with its range, throughput, MFU
and its cost against the baseline's predicted time."""

from __future__ import annotations


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:,.2f} ms"


def time_lines(results: list) -> list[str]:
    """Lines for the runs whose record holds a predicted step time (CUDA predictions of one GPU), none where no
    run has one."""
    timed = [r for r in results if getattr(r, "predicted_time", None) is not None]
    if not timed:
        return []
    baseline = next((r.predicted_time for r in timed if r.is_baseline), None)
    gpu = timed[0].predicted_time.gpu
    lines = [f"Predicted step time on {gpu} (a prediction: no GPU ran; the range takes every efficiency figure at "
             "its published band's ends; docs/time.md):"]
    width = max(len(r.name) for r in timed)
    for r in timed:
        t = r.predicted_time
        mfu = f"MFU {t.mfu:.0%} of {t.peak_dtype} peak" if t.mfu is not None else "MFU -"
        line = (f"  {r.name:<{width}}  {_ms(t.step_s)} ({_ms(t.low_s)}-{_ms(t.high_s)})  "
                f"{t.throughput:,.1f} {t.unit}/s  {mfu}")
        if baseline is not None and not r.is_baseline and baseline.step_s > 0:
            line += f"  {r.name}: {round((t.step_s / baseline.step_s - 1) * 100):+d}% step time vs baseline"
        lines.append(line)
    return lines


def breakdown_line(t) -> str:
    """The per-class busy time of one prediction, largest first."""
    parts = sorted(((k, v) for k, v in t.by_class_s.items() if v > 0), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {_ms(seconds)}" for name, seconds in parts)


def fastest_lines(fits: list) -> list[str]:
    """fit --objective speed: each fitted technique's predicted throughput at its largest batch, the fastest
    first. Each technique is timed at the largest batch it fits (a larger batch is rarely slower per sample; smaller
    ones are not searched)."""
    timed = sorted((f for f in fits if f.throughput), key=lambda f: -f.throughput)
    if not timed:
        return []
    best = timed[0]
    lines = [f"Fastest that fits (predicted step time, no GPU ran): {best.run} at batch {best.batch}, "
             f"{best.throughput:,.1f} {best.unit}/s ({_ms(best.step_s)} a step)"]
    lines += [f"  {f.run} at batch {f.batch}: {f.throughput:,.1f} {f.unit}/s ({_ms(f.step_s)} a step, "
              f"{best.throughput / f.throughput - 1:+.0%} slower per {f.unit.rstrip('s')} than {best.run})"
              for f in timed[1:]]
    return lines
