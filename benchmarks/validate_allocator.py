"""Replay real CUDA memory snapshots through membench's caching-allocator simulator and say how close it is.

    python benchmarks/validate_allocator.py [FOLDER]

FOLDER (default: ../shared/cuda-snapshots beside the repository) holds snapshots recorded on GPUs by public projects;
it is development data, not shipped. For each snapshot: the state at its first event is rebuilt backwards from the
final one, its alloc / free_completed / segment_free events are replayed with default settings, and the recorded
segment allocations and peak reserved are compared with the simulated ones. Exact = every segment allocation the same
size, caused by the same allocation, in the same order, and the peak reserved equal to the byte.

Two replays per file: new segments at the addresses the trace recorded (so every allocation's address can be
checked too), and new segments at addresses of the simulator's own (as `membench predict` has no recorded ones).
Exit 0 when every replay is exact, 1 otherwise, 0 with a message when the folder is absent.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

from tabulate import tabulate  # noqa: E402

from membench.allocator.replay import actual_of, compare, replay  # noqa: E402
from membench.allocator.snapshot import initial_state, load_snapshot  # noqa: E402

DEFAULT_FOLDER = Path(__file__).resolve().parents[1].parent / "shared" / "cuda-snapshots"


def validate(folder: Path) -> tuple[list[list], bool]:
    rows, all_exact = [], True
    for path in sorted(folder.glob("*.pickle")):
        started = time.perf_counter()
        trace = initial_state(load_snapshot(path))
        actual = actual_of(trace)
        recorded = replay(trace)
        laid_out = replay(trace, recorded_addresses=False)
        seconds = time.perf_counter() - started
        first, second = compare(actual, recorded), compare(actual, laid_out)
        all_exact &= first.exact and second.exact
        rows.append([path.name, len(trace.events), actual.peak_reserved_bytes, recorded.peak_reserved_bytes,
                     f"{first.matched}/{first.total}", f"{recorded.same_address}/{actual.allocs}",
                     "yes" if first.exact else "NO",
                     laid_out.peak_reserved_bytes, f"{second.matched}/{second.total}",
                     "yes" if second.exact else "NO", f"{seconds:.3f}"])
    return rows, all_exact


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else DEFAULT_FOLDER
    if not folder.is_dir():
        print(f"skipped: no snapshot folder at {folder} (development data, not shipped with membench)")
        return 0
    started = time.perf_counter()
    rows, all_exact = validate(folder)
    if not rows:
        print(f"skipped: no *.pickle in {folder}")
        return 0
    headers = ["file", "events", "actual peak reserved (B)", "simulated (B)", "segment allocs matched",
               "allocs at recorded address", "exact", "simulated, own addresses (B)", "matched", "exact", "time (s)"]
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    print(f"\n{sum(r[6] == 'yes' and r[9] == 'yes' for r in rows)} of {len(rows)} snapshots exact; "
          f"{time.perf_counter() - started:.2f} s for all (loading, rebuilding and both replays)")
    return 0 if all_exact else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
