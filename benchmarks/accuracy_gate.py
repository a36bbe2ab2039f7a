"""The accuracy gate: every committed real-GPU comparison predicted again, each row held against the committed table.

    python benchmarks/accuracy_gate.py [--update] [--only TEXT] [--jobs N] [--plant-mib N]

Rows, each predicted on this machine's CPU with the installed torch:
- gpu-runs: the H200's `membench run` records in results/gpu-runs/ (validate_gpu_runs.py): peak allocated and
  reserved against what the GPU measured;
- gpu-traces: the H200's whole-process traces in results/gpu-traces/ (trace_differences.py): how many places the
  predicted allocations and frees differ from the trace's;
- gpu-truth: the eight traces of ../shared/gpu-truth (validate_predictions.py): peak allocated and reserved;
- hf-doc: the Hugging Face performance doc's seven rows (validate_predictions.py): NVML MB, in the three software
  columns.

The committed table is results/accuracy/torch-<release>.json, one per torch release, since membench follows the
installed release's rules (versions.py) and the data means most under the release it was recorded with (2.11 for
all of the above but hf-doc, which names no release): `nox -s accuracy` installs that one. A row further off than
the table (more bytes or MB from the measurement, more differences, an error where the table has a prediction, or
gone) fails the gate; a row closer is said, and `--update` writes the table (on purpose, like the memory gate's
baseline). `--plant-mib N` adds N MiB to every cuBLAS workspace a prediction makes: the gate's own test, which must
fail.

Exit status: 0 no row further off; 1 a row further off, or nothing compared; 2 bad arguments; 3 no committed table
for this torch release (`--update` writes one).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's membench, run from anywhere
sys.path.insert(0, str(HERE))  # the validation scripts, as modules

ROOT = HERE.parent
TABLES = ROOT / "results" / "accuracy"
NO_TABLE = 3
# What a row holds, and how "further off" reads for each: the absolute distance from the measurement.
DISTANCES = ("allocated_off", "reserved_off", "differences", "mb_off_today", "mb_off_1_10", "mb_off_1_9")


def gpu_run_rows(only: str | None, jobs: int) -> dict[str, dict]:
    import validate_gpu_runs as v

    rows = {}
    with tempfile.TemporaryDirectory() as work, ProcessPoolExecutor(jobs) as pool:
        found = []
        for index, archive in enumerate(sorted(v.ARCHIVES.glob("*.tar.xz"))):
            found += v.runs_in(archive, Path(work) / str(index), only)
        for r in (pool.map(v.predict_one, *zip(*found)) if found else []):
            key = f"gpu-runs/{r.case}/{r.run}"
            rows[key] = {"error": r.error} if r.predicted_allocated is None else {
                "allocated_off": abs(r.predicted_allocated - r.measured_allocated),
                "reserved_off": abs(r.predicted_reserved - r.measured_reserved)}
    return rows


def gpu_trace_rows(only: str | None, jobs: int) -> dict[str, dict]:
    import tarfile

    import trace_differences as t

    rows = {}
    with tempfile.TemporaryDirectory() as work, ProcessPoolExecutor(jobs) as pool:
        records = []
        for index, archive in enumerate(sorted(t.ARCHIVES.glob("*.tar.xz"))):
            with tarfile.open(archive) as tar:
                tar.extractall(Path(work) / str(index), filter="data")
            records += [p for p in sorted((Path(work) / str(index)).rglob("*.json"))
                        if p.with_name(p.stem + ".snapshot.pickle.xz").is_file()
                        and (only or "") in f"gpu-traces/{p.parent.name}/{p.stem}"]
        for r in pool.map(t.compare_one, records):
            rows[f"gpu-traces/{r.case}"] = {"error": r.error} if r.error else {"differences": r.differences}
    return rows


def gpu_truth_rows(only: str | None) -> dict[str, dict] | None:
    """None when ../shared/gpu-truth is absent (development data beside the repository)."""
    import validate_predictions as v

    traces = v.DEFAULT_TRUTH / "traces"
    if not traces.is_dir():
        return None
    rows = {}
    for ctx, kind, autocast in v.CASES:
        key = f"gpu-truth/medium ctx{ctx} {kind}" + (" bf16 autocast" if autocast else "")
        if only and only not in key:
            continue
        p_alloc, p_res = v.predicted(v.DEFAULT_TRUTH, ctx, kind == "training", autocast)
        r_alloc, r_res, _ = v.real(traces / f"medium_{ctx}_{kind}_memory_snapshot.pickle")
        rows[key] = {"allocated_off": abs(p_alloc - r_alloc), "reserved_off": abs(p_res - r_res)}
    return rows


def hf_doc_rows(only: str | None) -> dict[str, dict]:
    import validate_predictions as v

    if only and not any(only in f"hf-doc/{setting}" for setting, *_ in v.HF_ROWS):
        return {}
    return {f"hf-doc/{setting}": {name: round(abs(mb - published), 1) for name, mb in
                                  zip(("mb_off_today", "mb_off_1_10", "mb_off_1_9"), mbs)}
            for setting, published, mbs, _ in v.hf_predictions() if not only or only in f"hf-doc/{setting}"}


def plant(mib: int) -> None:
    """Every cuBLAS workspace a prediction makes `mib` MiB larger: an error planted in one emulation."""
    from membench.predict.emulate import cublas

    made = cublas.CublasWorkspaces.__init__

    def planted(self, nbytes: int, lt_nbytes: int = 0):
        made(self, nbytes + mib * 2**20, lt_nbytes)

    cublas.CublasWorkspaces.__init__ = planted


def further_off(now: dict, then: dict) -> list[str]:
    """Why row `now` is further off than the committed `then` (empty: it is not)."""
    if "error" in now and "error" not in then:
        return [f"not predicted now: {now['error'][:120]}"]
    return [f"{name} {then[name]:,} -> {now[name]:,}" for name in DISTANCES
            if name in then and name in now and now[name] > then[name]]


def compare(rows: dict[str, dict], table: dict[str, dict], skipped: set[str]) -> tuple[list[str], list[str]]:
    """(lines of rows further off or gone, lines of rows closer) of `rows` against the committed `table`."""
    worse, better = [], []
    for key, then in table.items():
        if any(key.startswith(prefix) for prefix in skipped):
            continue
        if key not in rows:
            worse.append(f"{key}: gone (the committed table has it)")
            continue
        worse += [f"{key}: {why}" for why in further_off(rows[key], then)]
        better += [f"{key}: {name} {then[name]:,} -> {rows[key][name]:,}" for name in DISTANCES
                   if name in then and name in rows[key] and rows[key][name] < then[name]]
    return worse, better


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="write the committed table from this run")
    parser.add_argument("--only", default=None, help="only rows whose name contains this text")
    parser.add_argument("--jobs", type=int, default=2, help="predictions at a time, each in its own process")
    parser.add_argument("--plant-mib", type=int, default=0, help="the gate's own test: a planted error (MiB)")
    parser.add_argument("--tables", type=Path, default=TABLES, help=f"the committed tables (default {TABLES})")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.plant_mib < 0:
        parser.error("--jobs must be 1 or more and --plant-mib 0 or more")
    if args.update and (args.only or args.plant_mib):
        parser.error("--update writes the whole table: not with --only or --plant-mib")
    import torch

    release = torch.__version__.split("+")[0]
    path = args.tables / f"torch-{release}.json"
    if not path.is_file() and not args.update:
        print(f"accuracy_gate: no committed table for torch {release} ({_shown(path)}); tables: "
              f"{', '.join(p.name for p in sorted(args.tables.glob('*.json'))) or 'none'}", file=sys.stderr)
        return NO_TABLE
    if args.plant_mib:
        plant(args.plant_mib)
    rows = {**gpu_run_rows(args.only, args.jobs), **gpu_trace_rows(args.only, args.jobs)}
    truth = gpu_truth_rows(args.only)
    skipped = set()
    if truth is None:
        print("accuracy_gate: ../shared/gpu-truth is absent: its rows are not compared")
        skipped.add("gpu-truth/")
    rows.update(truth or {})
    rows.update(hf_doc_rows(args.only))
    if args.update:
        args.tables.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(sorted(rows.items())), indent=1) + "\n")
        print(f"accuracy_gate: wrote {len(rows)} rows to {_shown(path)} (torch {torch.__version__})")
        return 0
    table = json.loads(path.read_text())
    if args.only:
        table = {k: v for k, v in table.items() if args.only in k}
    worse, better = compare(rows, table, skipped)
    if not rows or not table:
        print("accuracy_gate: nothing compared" + (f" matching {args.only!r}" if args.only else ""))
        return 1
    print(f"accuracy_gate: {len(rows)} rows predicted with torch {torch.__version__} against "
          f"{_shown(path)}" + (f" (planted: +{args.plant_mib} MiB per cuBLAS workspace)"
                                         if args.plant_mib else ""))
    for line in better:
        print(f"  closer: {line}")
    if better:
        print("  (closer rows pass; `--update` writes them into the table)")
    for line in worse:
        print(f"  FURTHER OFF: {line}")
    worse_rows = {line.split(": ", 1)[0] for line in worse}
    better_rows = {line.split(": ", 1)[0] for line in better} - worse_rows
    compared = [k for k in table if not any(k.startswith(prefix) for prefix in skipped)]
    print(f"accuracy_gate: {len(worse_rows)} rows further off, {len(better_rows)} closer, "
          f"{len(compared) - len(worse_rows) - len(better_rows)} as committed"
          + (f", {len(table) - len(compared)} not compared" if len(compared) < len(table) else ""))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
