"""Where the CUDA driver put the caching allocator's segments, read from real snapshots; the evidence behind the
simulator's address assignment (membench/allocator/simulator.py, CachingAllocator._first_fit).

    PYTHONPATH=$PWD:<einops, einx, jaxtyping> python benchmarks/segment_addresses.py [--no-diagnostic]

Reads ../shared/cuda-snapshots and ../shared/gpu-truth: development data beside the repository, not shipped (see
their READMEs); without them it says so and exits 0. Table 3 takes about a minute (it predicts the eight runs).

1. Every snapshot that records segment_alloc events: each new segment's address against the segment made before it
   (of any size, and of its own pool), whether it starts where another segment ends, whether it lies in a range a
   segment_free gave back, its alignment, and how far below the one before it a segment of the same size lies.
2. The eight gpu-truth traces record (but for one) no segment_alloc: their segments were all made before recording.
   Their layout at the first recorded event: the lowest address, the first parameter's, the ranges inside the span
   that no segment holds.
3. A diagnostic (not the product): each gpu-truth process as `validate_predictions.py` predicts it, replayed with
   a driver that is address-ordered first fit and that also holds, as the real one did, the ranges of (2) that no
   segment holds, and the range below the first parameter's segment until the first segment after the parameters.
   Prints whether the simulated layout when recording starts is the trace's, segment for segment, and both peaks
   against the trace's; beside them, the simulator's own placement (no knowledge of those ranges). --below-only:
   the driver holds only the range below the parameters; --below-mib N: that range is N MiB.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

from tabulate import tabulate  # noqa: E402

from membench.allocator import run_events  # noqa: E402
from membench.allocator.simulator import SMALL_BUFFER, CachingAllocator  # noqa: E402
from membench.allocator.snapshot import SEGMENT_ALLOC, SEGMENT_FREE, initial_state, load_snapshot  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MiB = 2**20


def recorded_placements(path: Path) -> list | None:
    """Table 1's row for a snapshot with segment_alloc events, else None."""
    snapshot = load_snapshot(path)
    events = snapshot["device_traces"][0] if snapshot["device_traces"] else []
    news = [e for e in events if e["action"] == SEGMENT_ALLOC]
    if not news:
        return None
    count, steps, freed, previous = collections.Counter(), collections.Counter(), [], None
    # where any segment of the snapshot ends (those held at the end, and those the events make or free)
    ends = {seg["address"] + seg["total_size"] for seg in snapshot["segments"]}
    ends |= {e["addr"] + e["size"] for e in events if e["action"] in (SEGMENT_ALLOC, SEGMENT_FREE)}
    previous_of_pool = {True: None, False: None}
    for event in events:
        if event["action"] == SEGMENT_FREE:
            freed.append((event["addr"], event["size"]))
        if event["action"] != SEGMENT_ALLOC:
            continue
        address, size = event["addr"], event["size"]
        small = size == SMALL_BUFFER
        if previous is not None:
            count["below"] += address < previous[0]
            count["contiguous"] += address == previous[0] + previous[1] or address + size == previous[0]
        if previous_of_pool[small] is not None:
            count["n", small] += 1
            count["below", small] += address < previous_of_pool[small][0]
        count["reused"] += any(a < address + size and address < a + s for a, s in freed)
        count["aligned"] += address % (2 * MiB) == 0
        count["after another"] += address in ends
        if previous is not None and previous[1] == size:
            steps[size // MiB, (previous[0] - address) // MiB] += 1
        previous = previous_of_pool[small] = address, size
    common = ", ".join(f"{size}: {step} x{n}" for (size, step), n in steps.most_common(4))
    return [path.name, len(news), len(freed), f"{news[0]['addr']:#x}", f"{count['below']}/{len(news) - 1}",
            f"{count['below', True]}/{count['n', True]}", f"{count['below', False]}/{count['n', False]}",
            count["contiguous"], count["after another"], count["reused"], f"{count['aligned']}/{len(news)}", common]


def layout(path: Path) -> list[tuple[int, int]]:
    """(address, size) of the trace's segments when recording started, by address."""
    return sorted((s.address, s.size) for s in initial_state(load_snapshot(path)).segments)


def unheld(segments: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges inside the span that no segment holds."""
    return [(a + s, b - a - s) for (a, s), (b, _) in zip(segments, segments[1:]) if b > a + s]


def first_fit_driver(held: list[tuple[int, int]], below: tuple[int, int], opens_at: int, first: int):
    """A segment_address chooser: the first segment at `first`, then address-ordered first fit from the bottom of
    `below`, around the simulator's live segments and `held`; `below` is held too until the `opens_at`-th new
    segment (0-based) has been placed."""
    state = {"made": 0, "alloc": None}

    def choose(size: int) -> int:
        made = state["made"]
        state["made"] += 1
        taken = sorted([*held, *state["alloc"].live_segments.items(), *([below] if made <= opens_at else [])])
        cursor = first if made == 0 else below[0]  # the first segment: where the trace's first one lies
        for start, length in taken:
            if start >= cursor + size:
                break
            cursor = max(cursor, start + length)
        return cursor
    return choose, state


def diagnostic(truth: Path, below_only: bool = False, below_mib: int | None = None) -> list[list]:
    """Table 3's rows; below_only: the driver holds only the range below the parameters (not the others of table
    2); below_mib: that range's size instead of the trace's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(truth))
    import validate_predictions as vp
    from cs336_basics.model import BasicsTransformerLM

    from membench.predict.emulate import fake

    rows = []
    for ctx, kind, autocast in vp.CASES:
        path = truth / "traces" / f"medium_{ctx}_{kind}_memory_snapshot.pickle"
        real_alloc, real_reserved, _ = vp.real(path)
        trace = vp.predicted_trace(truth, ctx, kind == "training", autocast)
        reset = next(i for i, e in enumerate(trace) if e.kind == "reset_peak")
        meta = fake.build_on_meta(lambda ctx=ctx: BasicsTransformerLM(
            vocab_size=vp.VOCAB, context_length=ctx, d_model=1024, num_layers=24, num_heads=16, d_ff=4096))
        moved = len(list(meta.parameters())) + len(list(meta.buffers()))  # model.to(device): one malloc each
        own = CachingAllocator()
        run_events(own, trace[:reset])
        # the segment index of the first segment made after the parameters (their mallocs come first)
        opens_at = sum(e.action == "alloc" and e.at_malloc <= moved for e in own.segment_log)
        segments = layout(path)
        first_param = _first_of(own, segments)
        bottom = segments[0][0] if below_mib is None else first_param - below_mib * MiB
        below = (bottom, first_param - bottom)
        held = [(0, bottom), *([] if below_only else unheld(segments))]
        choose, state = first_fit_driver(held, below, opens_at, first_param)
        alloc = CachingAllocator(segment_address=choose)
        state["alloc"] = alloc
        live: dict = {}
        run_events(alloc, trace[:reset], live)
        same = sorted(alloc.live_segments.items()) == segments
        result = run_events(alloc, trace[reset:], live)
        plain = run_events(CachingAllocator(), trace)
        name = f"medium ctx{ctx} {kind}" + (" bf16 autocast" if autocast else "")
        rows.append([name, f"{below[1] // MiB} MiB", opens_at, "yes" if same else "no",
                     *(f"{got - want:+,}" for got, want in [
                         (result.peak_allocated_bytes, real_alloc), (result.peak_reserved_bytes, real_reserved),
                         (plain.peak_allocated_bytes, real_alloc), (plain.peak_reserved_bytes, real_reserved)])])
    return rows


def _first_of(own: CachingAllocator, segments: list[tuple[int, int]]) -> int:
    """The trace's address of the first parameter's segment: the first segment whose size sequence from there on
    starts as the prediction's first segments do (the parameters, moved in order)."""
    sizes = [e.size for e in own.segment_log if e.action == "alloc"][:8]
    for i in range(len(segments)):
        if [s for _, s in segments[i:i + len(sizes)]] == sizes:
            return segments[i][0]
    raise ValueError("the parameters' segments are not in the trace")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-diagnostic", action="store_true", help="leave out table 3 (needs the model's code)")
    parser.add_argument("--below-only", action="store_true",
                        help="table 3: the driver holds only the range below the parameters, none of the others")
    parser.add_argument("--below-mib", type=int, help="table 3: that range's size in MiB instead of the trace's")
    args = parser.parse_args(argv)
    snapshots, truth = SHARED / "cuda-snapshots", SHARED / "gpu-truth"
    if not snapshots.is_dir() and not truth.is_dir():
        print(f"segment_addresses: {SHARED} holds neither cuda-snapshots nor gpu-truth: nothing read, exit 3",
              file=sys.stderr)
        return 3
    paths = sorted(snapshots.glob("*.pickle")) + sorted((truth / "traces").glob("*.pickle"))
    rows = [row for row in map(recorded_placements, paths) if row]
    print("1. New segments in recorded order (each against the one made before it):\n")
    print(tabulate(rows, headers=["snapshot", "segment allocs", "segment frees", "first address", "below previous",
                                  "2 MiB below previous 2 MiB", "large below previous large",
                                  "adjacent to previous", "at another's end", "in a freed range", "2 MiB aligned",
                                  "same size as previous: MiB: step down MiB x count"]))
    rows = []
    for path in sorted((truth / "traces").glob("*.pickle")):
        segments = layout(path)
        gaps = ", ".join(f"{a:#x}+{s // MiB}" for a, s in unheld(segments))
        rows.append([path.name.replace("_memory_snapshot.pickle", ""), len(segments), f"{segments[0][0]:#x}",
                     f"{segments[-1][0] + segments[-1][1]:#x}", gaps])
    print("\n2. The gpu-truth traces' segments when recording started (MiB not held by any segment, by address):\n")
    print(tabulate(rows, headers=["trace", "segments", "lowest", "end", "ranges no segment holds (MiB)"]))
    if not args.no_diagnostic and truth.is_dir():
        print("\n3. Diagnostic: each predicted process with an address-ordered first-fit driver that holds what the "
              "real one held\n   (the ranges of 2; the range below the parameters until the first segment after "
              "them), vs the simulator's own placement:\n")
        print(tabulate(diagnostic(truth, args.below_only, args.below_mib), headers=[
            "trace", "below params", "opens at segment", "layout = trace's", "peak alloc diff B",
            "peak reserved diff B", "own placement: alloc diff B", "reserved diff B"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
