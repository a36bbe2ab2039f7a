"""Each whole-process GPU trace in results/gpu-traces/ against its prediction, allocation for allocation.

    python benchmarks/trace_differences.py [ARCHIVE ...] [--only TEXT] [--jobs N]

An archive (benchmarks/gpu_traces.py made them) holds, per case, the record of a `membench run` on a GPU and the
caching allocator's history from the process's first allocation. Each case's spec is predicted here, on this CPU,
for the GPU it ran on, and the prediction's allocations and frees (sizes, in order, from construction to the end of
its measured step: a prediction's last event) are set beside the trace's (whose later steps are left out): "same"
when the two are one sequence, else the number of places they differ (difflib's non-equal blocks) and the first
of them, with the trace's Python frame there. Rules membench keys by torch release follow the installed torch, so
the comparison means most under the torch the traces were recorded with (the table names both).

Exit status: 0 printed; 1 no archive or no case in it; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import difflib
import json
import lzma
import sys
import tarfile
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

ROOT = Path(__file__).resolve().parents[1]
ARCHIVES = ROOT / "results" / "gpu-traces"


@dataclass
class Compared:
    case: str
    torch: str
    events: int = 0  # the prediction's, and the trace's over the same span
    differences: int = 0
    first: str = ""
    error: str = ""


def _events(trace: list[dict]) -> tuple[list[tuple[str, int]], list[dict]]:
    """The trace's ("A"|"F", bytes) in order, and the events themselves."""
    kept = [e for e in trace if e["action"] in ("alloc", "free_completed")]
    return [("A" if e["action"] == "alloc" else "F", e["size"]) for e in kept], kept


def _predicted(events) -> list[tuple[str, int]]:
    sizes, out = {}, []
    for e in events:
        if e.kind == "alloc":
            sizes[e.key] = e.size
            out.append(("A", e.size))
        elif e.kind == "free" and e.key in sizes:
            out.append(("F", sizes.pop(e.key)))
    return out


def _frame(event: dict) -> str:
    frames = event.get("frames") or []
    return next((f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames), "(no Python frame)")


def compare_one(record: Path) -> Compared:
    from membench.allocator.snapshot import load_snapshot
    from membench.predict import beside
    from membench.spec import Job

    packed = record.with_name(record.stem + ".snapshot.pickle.xz")
    row = Compared(f"{record.parent.name}/{record.stem}", "?")
    try:
        data = json.loads(record.read_text())
        row.torch = data["environment"].get("torch", "?")
        unpacked = packed.with_suffix("")  # in the caller's temporary folder
        unpacked.write_bytes(lzma.decompress(packed.read_bytes()))
        real, kept = _events(load_snapshot(unpacked)["device_traces"][0])
        target = beside.target_named(data["environment"].get("device_name", ""))
        if isinstance(target, str):
            row.error = target
            return row
        predicted = _predicted(beside.predict_for(Job.from_dict(data["job"]), target).traced.events)
    except Exception as exc:  # noqa: BLE001 - one case's failure is its own row
        row.error = f"{type(exc).__name__}: {str(exc)[:160]}"
        return row
    blocks = [b for b in difflib.SequenceMatcher(None, real, predicted, autojunk=False).get_opcodes()
              if b[0] != "equal"]
    if blocks and blocks[-1][0] == "delete" and blocks[-1][2] == len(real) and blocks[-1][3] == len(predicted):
        blocks.pop()  # the trace's steps after the prediction's last
    row.events, row.differences = len(predicted), len(blocks)
    if blocks:
        tag, i1, i2, j1, j2 = blocks[0]
        shown = real[i1] if i1 < i2 else None
        row.first = (f"event {i1}: trace {shown or '-'} ({_frame(kept[i1]) if shown else ''}), predicted "
                     f"{predicted[j1] if j1 < j2 else '-'}")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archives", nargs="*", type=Path, help=f"default: every .tar.xz in {ARCHIVES}")
    parser.add_argument("--only", default="", help="only cases whose run/case name contains this text")
    parser.add_argument("--jobs", type=int, default=2, help="predictions at a time, each in its own process")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be 1 or more")
    archives = args.archives or sorted(ARCHIVES.glob("*.tar.xz"))
    if not archives:
        print(f"trace_differences: no archive of GPU traces in {ARCHIVES}")
        return 1
    import torch
    from tabulate import tabulate

    with tempfile.TemporaryDirectory() as work, ProcessPoolExecutor(args.jobs) as pool:
        records = []
        for index, archive in enumerate(archives):
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(Path(work) / str(index), filter="data")
            except (OSError, tarfile.TarError) as exc:
                parser.error(f"cannot read {archive} as an archive of GPU traces (a .tar.xz): "
                             f"{type(exc).__name__}: {str(exc)[:120]}")
            records += [p for p in sorted((Path(work) / str(index)).rglob("*.json"))
                        if (p.with_name(p.stem + ".snapshot.pickle.xz")).is_file()
                        and args.only in f"{p.parent.name}/{p.stem}"]
        rows = list(pool.map(compare_one, records))
    if not rows:
        print("trace_differences: no case" + (f" matching {args.only!r}" if args.only else ""))
        return 1
    print(tabulate([[r.case, r.torch, f"{r.events:,}" if r.events else "",
                     r.error or ("same" if not r.differences else str(r.differences)), r.first] for r in rows],
                   headers=["run/case", "traced on torch", "events", "differences", "first difference"],
                   disable_numparse=True))
    same = sum(not r.error and not r.differences for r in rows)
    print(f"\n{same} of {len(rows)} predictions (torch {torch.__version__}) make the trace's allocations and frees "
          "event for event, through the end of their measured step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
