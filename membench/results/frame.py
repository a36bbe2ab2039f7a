"""Results as a pandas DataFrame: the table `run_sweep` returns."""

from __future__ import annotations

from membench.results.schema import RunRecord


def to_frame(results: list[RunRecord]):
    """One row per run: the numbers people compare, in bytes and seconds, plus the change against the baseline."""
    import pandas as pd

    rows = []
    for r in results:
        mem, timing, eq = r.memory, r.timing, r.equivalence
        rows.append({
            "run": r.name,
            "status": r.status,
            "workload": r.spec.run.workload,
            "batch_size": r.spec.run.batch_size,
            "device": r.env.device if r.env else r.spec.run.device,
            "device_name": r.env.device_name if r.env else None,
            "predicted": r.predicted,
            "peak_allocated_bytes": mem.peak_allocated_bytes if mem else None,
            "peak_reserved_bytes": mem.peak_reserved_bytes if mem else None,
            "driver_used_bytes": mem.driver_used_bytes if mem else None,
            "peak_phase": mem.peak_phase if mem else None,
            "median_step_s": timing.median_s if timing else None,
            "iqr_step_s": timing.iqr_s if timing else None,
            "ci_low_step_s": timing.ci_low_s if timing else None,
            "ci_high_step_s": timing.ci_high_s if timing else None,
            "noisy": timing.noisy if timing else None,
            "throughput": timing.throughput if timing else None,
            "throughput_unit": timing.unit if timing else None,
            "tflops": (timing.achieved_flops or 0) / 1e12 or None if timing else None,
            "mfu": timing.mfu if timing else None,
            "equivalence": eq.verdict if eq else None,
            "error": r.error,
        })
    df = pd.DataFrame(rows)
    # Deltas against the baseline of the same sweep, and only one that finished: an OOM baseline's peak is partial.
    key = ["workload", "batch_size", "device", "predicted"]
    for col, delta in (("peak_allocated_bytes", "peak_vs_baseline_pct"), ("throughput", "throughput_vs_baseline_pct")):
        df[delta] = None
        for _, group in df.groupby(key, dropna=False, sort=False):
            base = group[(group["run"] == "baseline") & (group["status"] == "ok")]
            ref = base[col].iloc[0] if len(base) and base[col].notna().iloc[0] else None
            if ref:
                df.loc[group.index, delta] = (group[col] / ref - 1) * 100
    return df
