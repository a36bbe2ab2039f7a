"""Replay real CUDA memory snapshots through membench's caching-allocator simulator and say how close it is.

    python benchmarks/validate_allocator.py [FOLDER_OR_FILE ...]

The default folder, ../shared/cuda-snapshots beside the repository, holds snapshots recorded on GPUs by public
projects; it is development data, not shipped. On a GPU, `membench run --device cuda` leaves a
`<run>.snapshot.pickle` beside each result: `python benchmarks/validate_allocator.py results/` checks those (folders
are searched recursively; snapshots that cannot be replayed, such as OOM snapshots without a trace, are listed
apart). For each snapshot: the state at its first event is rebuilt backwards from the final one, its alloc /
free_completed / segment_free events are replayed with the allocator settings it was recorded with (default when
it does not say), and the recorded segment allocations and peak reserved are compared with the simulated ones.
Exact = every segment allocation the same size, caused by the same allocation, in the same order, and the peak
reserved equal to the byte.

Three replays per file: new segments at the addresses the trace recorded (so every allocation's address can be
checked too), and new segments at addresses of the simulator's own (as `membench predict` has no recorded ones):
one after another, ascending, and each below the ones before (top-down, what `membench predict` assumes).
Exit 0 when the first two replays of every file are exact, 1 otherwise, 3 with a line saying so when the folder is
absent (nothing checked). Whole-process traces of H200 runs, with every segment's address (results/gpu-traces/,
made by benchmarks/gpu_traces.py), are checked by unpacking them and naming the folder.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

from tabulate import tabulate  # noqa: E402

from membench.allocator.replay import actual_of, compare, replay  # noqa: E402
from membench.allocator.snapshot import initial_state, load_snapshot  # noqa: E402
from membench.common.errors import UserError  # noqa: E402

DEFAULT_FOLDER = Path(__file__).resolve().parents[1].parent / "shared" / "cuda-snapshots"


def validate(paths: list[Path]) -> tuple[list[list], list[str], bool]:
    rows, skipped, all_exact = [], [], True
    for path in paths:
        started = time.perf_counter()
        try:
            trace = initial_state(load_snapshot(path))
        except UserError as exc:
            skipped.append(f"{path.name}: {exc}")
            continue
        actual = actual_of(trace)
        recorded = replay(trace)
        laid_out = replay(trace, recorded_addresses=False)
        top_down = replay(trace, recorded_addresses=False, placement="top-down")
        seconds = time.perf_counter() - started
        first, second, third = compare(actual, recorded), compare(actual, laid_out), compare(actual, top_down)
        all_exact &= first.exact and second.exact
        rows.append([path.name, len(trace.events), actual.peak_reserved_bytes, recorded.peak_reserved_bytes,
                     f"{first.matched}/{first.total}", f"{recorded.same_address}/{actual.allocs}",
                     "yes" if first.exact else "NO",
                     laid_out.peak_reserved_bytes, f"{second.matched}/{second.total}",
                     "yes" if second.exact else "NO",
                     top_down.peak_reserved_bytes, "yes" if third.exact else "NO", f"{seconds:.3f}"])
    return rows, skipped, all_exact


def main(argv: list[str]) -> int:
    given = [Path(a) for a in argv] or [DEFAULT_FOLDER]
    missing = [p for p in given if not p.exists()]
    if missing:
        print(f"validate_allocator: no snapshots at {', '.join(map(str, missing))} (development data, not shipped with "
              "membench): nothing checked, exit 3", file=sys.stderr)
        return 3
    paths = [q for p in given for q in (sorted(p.rglob("*.pickle")) if p.is_dir() else [p])]
    started = time.perf_counter()
    rows, skipped, all_exact = validate(paths)
    if rows:
        headers = ["file", "events", "actual peak reserved (B)", "simulated (B)", "segment allocs matched",
                   "allocs at recorded address", "exact", "simulated, own addresses (B)", "matched", "exact",
                   "top-down (B)", "exact", "time (s)"]
        print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
        print(f"\n{sum(r[6] == 'yes' and r[9] == 'yes' for r in rows)} of {len(rows)} snapshots exact; at the "
              f"recorded addresses {sum(r[6] == 'yes' for r in rows)}, at its own {sum(r[9] == 'yes' for r in rows)} "
              f"ascending and {sum(r[11] == 'yes' for r in rows)} top-down; "
              f"{time.perf_counter() - started:.2f} s for all (loading, rebuilding and the replays)")
    for line in skipped:
        print(f"not replayed: {line}")
    if not rows:
        print(f"no replayable snapshot among {len(paths)} file(s) in {', '.join(map(str, given))}")
    return 0 if all_exact else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
