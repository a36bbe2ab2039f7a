"""The result file schema (versioned), atomic writing, and loading a results directory into a DataFrame."""

from __future__ import annotations

import json
import math
from pathlib import Path

from membench.errors import UserError
from membench.fsio import atomic_write_text, make_dir

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "diverged", "error", "timeout")
# Runs that measured what they could and would measure the same again: --resume keeps them, and the sweep's exit
# code counts them as done (a diverged loss or an OOM is the technique's result, not a failure of the sweep).
FINISHED = ("ok", "oom", "diverged")


def write_json(path: Path, data: dict) -> None:
    """Write-then-rename (fsio): a reader (or a crash) never sees half a file. Strict JSON: a NaN or inf (a
    diverged loss) is written as null, never as the bare NaN that other JSON readers reject."""
    make_dir(path.parent)
    atomic_write_text(path, json.dumps(_finite(data), indent=1, default=_jsonable, allow_nan=False) + "\n")


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value):
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def result_path(out_dir: Path, run_name: str) -> Path:
    return Path(out_dir) / f"{run_name}.json"


def read_result(path: Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"results file {path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"results file {path} is a folder, not a result file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"results file {path} is corrupt (not JSON: {exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data or "status" not in data:
        raise UserError(f"results file {path} is not a membench result (no schema_version/status)")
    if data["schema_version"] > SCHEMA_VERSION:
        raise UserError(f"results file {path} has schema {data['schema_version']}; this membench reads up to "
                        f"{SCHEMA_VERSION}: upgrade membench")
    return data


def load_dir(path: Path) -> list[dict]:
    """All results under a directory (recursively), or one file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"results path {path} does not exist")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.json") if _is_result_name(p, path))
    results = [read_result(p) for p in files if p.name != "sweep.json"]
    if not results:
        raise UserError(f"no membench results under {path}")
    for r, p in zip(results, files):
        r.setdefault("_path", str(p))
    return results


def _is_result_name(p: Path, root: Path) -> bool:
    """Result files, not the files beside them: run specs (runs/), archived results (previous/), timelines."""
    parts = p.relative_to(root).parts
    return not (p.name.startswith(".") or p.name.endswith((".spec.json", ".timeline.json"))
                or "runs" in parts[:-1] or "previous" in parts[:-1])


def is_finished(path: Path) -> bool:
    """A run counts as done for --resume when it measured something: ok, a deterministic OOM, a diverged loss."""
    try:
        return read_result(path)["status"] in FINISHED
    except UserError:
        return False


def to_frame(results: list[dict]):
    """One row per run: the numbers people compare, in bytes and seconds, plus the change against the baseline."""
    import pandas as pd

    rows = []
    for r in results:
        mem, timing, eq, spec, env = (r.get(k) or {} for k in ("memory", "timing", "equivalence", "spec", "env"))
        rows.append({
            "run": r["name"],
            "status": r["status"],
            "workload": spec.get("workload"),
            "batch_size": spec.get("batch_size"),
            "device": env.get("device"),
            "device_name": env.get("device_name"),
            "predicted": bool(r.get("predicted", False)),
            "peak_allocated_bytes": mem.get("peak_allocated_bytes"),
            "peak_reserved_bytes": mem.get("peak_reserved_bytes"),
            "driver_used_bytes": mem.get("driver_used_bytes"),
            "peak_phase": mem.get("peak_phase"),
            "median_step_s": timing.get("median_s"),
            "throughput": timing.get("throughput"),
            "throughput_unit": timing.get("unit"),
            "tflops": (timing.get("achieved_flops") or 0) / 1e12 or None,
            "mfu": timing.get("mfu"),
            "equivalence": eq.get("verdict"),
            "error": r.get("error"),
        })
    df = pd.DataFrame(rows)
    base = df[df["run"] == "baseline"]
    for col, delta in (("peak_allocated_bytes", "peak_vs_baseline_pct"), ("throughput", "throughput_vs_baseline_pct")):
        ref = base[col].iloc[0] if len(base) and base[col].notna().iloc[0] else None
        df[delta] = (df[col] / ref - 1) * 100 if ref else None
    return df
