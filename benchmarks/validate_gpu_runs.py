"""Predictions against the real GPU runs kept in results/gpu-runs/: each run re-predicted here, on this machine's CPU,
for the GPU it ran on, beside the peaks that GPU measured.

    python benchmarks/validate_gpu_runs.py [ARCHIVE ...] [--only TEXT] [--jobs N] [--write-doc]

An archive holds the results folders of `membench run --device cuda` runs (benchmarks/gpu_acceptance.py --keep,
packed as results/README.md says). Each run that measured its memory in one process is predicted from its own
record's spec, with the installed torch. Rules membench keys by torch release (versions.py) follow the installed
one, so a run recorded under another release is compared under this one's rules: the table names both releases.
Runs of several processes (fsdp) are left out: a prediction of those is per rank (`predict --world-size`).

Exit status: 0 printed; 1 no archive or no run in it; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

ROOT = Path(__file__).resolve().parents[1]
ARCHIVES = ROOT / "results" / "gpu-runs"
# The allocator settings benchmarks/gpu_acceptance.py ran these cases with (its run_checks), for the runs recorded
# before a record kept them (memory.allocator_settings); the allocator simulator follows them. cudaMallocAsync is
# not the caching allocator the simulator follows, so that case is not predicted.
ALLOC_CONF = {"cudaMallocAsync": "backend:cudaMallocAsync", "large_segment_size_mb64": "large_segment_size_mb:64"}


@dataclass
class Row:
    case: str
    run: str
    torch: str
    measured_allocated: int
    measured_reserved: int
    predicted_allocated: int | None = None
    predicted_reserved: int | None = None
    error: str | None = None
    seconds: float = 0.0


def runs_in(archive: Path, into: Path, only: str | None) -> list[tuple[str, Path]]:
    """(case folder, record path) of every run in `archive` that measured in one process."""
    from membench.results import read_result

    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    found = []
    for path in sorted(into.rglob("*.json")):
        if "." in path.stem or path.parent.name in ("runs", "report"):
            continue
        record = read_result(path)
        case = path.parent.name
        if (record.status == "oom" or record.memory is None or not record.memory.peak_allocated_bytes
                or (record.world_size or 1) > 1 or (only and only not in f"{case}/{record.name}")):
            continue
        found.append((case, path))
    return found


def predict_one(case: str, path: Path) -> Row:
    """The run's spec predicted for the table's entry of the GPU it ran on."""
    from membench.predict import beside
    from membench.results import read_result

    record = read_result(path)
    env = record.env
    # A run that failed after measuring its memory (torch 2.11's FLOP counter on grouped-query attention) keeps it
    name = record.name if record.status == "ok" else f"{record.name} *"
    row = Row(case, name, (env.torch if env else "?") or "?", record.memory.peak_allocated_bytes,
              record.memory.peak_reserved_bytes)
    target = beside.target_named(env.device_name or "")
    if isinstance(target, str):
        row.error = target
        return row
    recorded = record.memory.allocator_settings  # runs recorded before membench kept it: the table above
    conf = (recorded if recorded != "default" else None) if recorded is not None else ALLOC_CONF.get(case)
    if conf and "cudaMallocAsync" in conf:
        row.error = f"not predicted: ran with PYTORCH_CUDA_ALLOC_CONF={conf}"
        return row
    started = time.perf_counter()
    try:
        with _alloc_conf(conf):
            memory = beside.predict_for(record.spec, target).traced.memory
    except Exception as exc:  # noqa: BLE001 - one run's failure is its own row
        row.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return row
    row.seconds = time.perf_counter() - started
    row.predicted_allocated = memory.allocator_peak_allocated_bytes or memory.peak_allocated_bytes
    row.predicted_reserved = memory.peak_reserved_bytes
    return row


@contextlib.contextmanager
def _alloc_conf(conf: str | None):
    """PYTORCH_CUDA_ALLOC_CONF as the run had it, for one prediction (a pool's process predicts others after)."""
    before = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = before


def _short(text: str | None, width: int = 60) -> str | None:
    return text if text is None or len(text) <= width else text[:width - 3] + "..."


def _error(predicted: int | None, measured: int) -> str:
    if predicted is None:
        return ""
    if not measured:  # a run that allocated nothing on the GPU (measured 0 B)
        return "exact" if predicted == measured else "n/a"
    return f"{(predicted - measured) / measured:+.3%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archives", nargs="*", type=Path, help=f"default: every .tar.xz in {ARCHIVES}")
    parser.add_argument("--only", help="only runs whose case/run name contains this text")
    parser.add_argument("--jobs", type=int, default=2, help="predictions at a time, each in its own process")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be 1 or more")
    archives = args.archives or sorted(ARCHIVES.glob("*.tar.xz"))
    if not archives:
        print(f"validate_gpu_runs: no archive of GPU runs in {ARCHIVES}")
        return 1
    import torch
    from tabulate import tabulate

    from membench.common.errors import UserError

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as work, ProcessPoolExecutor(args.jobs) as pool:
        for index, archive in enumerate(archives):
            try:
                found = runs_in(archive, Path(work) / str(index), args.only)
            except (OSError, tarfile.TarError, UserError) as exc:  # UserError: a member that is no result
                parser.error(f"cannot read {archive} as an archive of GPU runs (a .tar.xz of results folders): "
                             f"{type(exc).__name__}: {str(exc)[:120]}")
            rows += pool.map(predict_one, *zip(*found)) if found else []
    if not rows:
        print("validate_gpu_runs: no run that measured in one process" + (f" matching {args.only!r}" if args.only
                                                                           else ""))
        return 1
    table = [[f"{r.case.removeprefix('predicted-vs-measured-')}/{r.run}", r.torch, f"{r.measured_allocated:,}",
              "" if r.predicted_allocated is None else f"{r.predicted_allocated:,}",
              "" if r.predicted_allocated is None else f"{r.predicted_allocated - r.measured_allocated:+,}",
              _error(r.predicted_allocated, r.measured_allocated), f"{r.measured_reserved:,}",
              "" if r.predicted_reserved is None else f"{r.predicted_reserved:,}",
              _error(r.predicted_reserved, r.measured_reserved), _short(r.error) or f"{r.seconds:.1f}"] for r in rows]
    print(tabulate(table, headers=["run (acceptance case/run)", "ran on torch", "measured alloc B", "predicted B",
                                   "diff B", "error", "measured reserved B", "predicted B", "error", "predict s"],
                   disable_numparse=True))
    if any(r.run.endswith(" *") for r in rows):
        print("* the run ended in an error after it had measured its memory (its record says which)")
    done = [r for r in rows if r.predicted_allocated is not None]
    exact = sum(r.predicted_allocated == r.measured_allocated for r in done)
    within = sum(abs(r.predicted_allocated - r.measured_allocated) <= 0.01 * r.measured_allocated for r in done)
    reserved = sum(abs(r.predicted_reserved - r.measured_reserved) <= 0.01 * r.measured_reserved for r in done)
    print(f"\n{len(done)} of {len(rows)} runs predicted with torch {torch.__version__}: peak allocated exact on "
          f"{exact}, within 1% on {within}; peak reserved within 1% on {reserved}")
    return 0


def write_doc(argv: list[str]) -> int:
    """`--write-doc`: run as asked and write what it printed into docs/accuracy.md's section of this script."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import doc_section

    rest = [a for a in argv if a != "--write-doc"]
    return doc_section.run_and_write(lambda: main(rest), doc_section.ACCURACY,
                                     "benchmarks/validate_gpu_runs.py --write-doc")


if __name__ == "__main__":
    sys.exit(write_doc(sys.argv[1:]) if "--write-doc" in sys.argv else main(sys.argv[1:]))
