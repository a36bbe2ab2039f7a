"""How fast a prediction is, against torch's MemTracker on the same steps, side by side in one run.

For each configuration (technique stack) of one workload, both start from the model built on `meta` and run the
same training step code (membench.step) on fake tensors, with the same techniques, batches and optimizer:

- membench: `predict_memory` as `membench predict` runs it (warm-up step and measured step under the storage
  tracker, every allocation traced, reserved memory from the allocator simulator);
- MemTracker (torch.distributed._tools.mem_tracker) under the same FakeTensorMode: a warm-up step, then the step
  tracked as its documentation shows (track_external on the model and optimizers).

Prints seconds per configuration for each, their ratio, and both peaks (membench's rounded to CUDA's 512-byte
blocks, MemTracker's unrounded: they differ by that rounding). Timings depend on the machine and its load: compare
ratios from one run. Usage:

    python benchmarks/predict_speed.py [--workload vit_l_16] [--batch-size 1] [--techniques baseline,ckpt,opt-in-bwd]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import torch
from tabulate import tabulate

from membench.api import plan
from membench.predict import _Prepared, predict_memory
from membench.step import batches, build_state, train_step
from membench.techniques import resolve
from membench.trackers import fake
from membench.units import fmt_bytes
from membench.workloads import load_workload


def memtracker_peak(job) -> int:
    """MemTracker's peak of the step after one warm-up step, everything on fake tensors, from the meta model."""
    from torch.distributed._tools.mem_tracker import MemTracker

    run = dataclasses.replace(job.run, device="cpu")
    workload = load_workload(run.workload, run.seq_len)
    stack = resolve(run, target_device="cuda")
    meta = fake.build_on_meta(workload.build_model)
    with fake.fake_tensors():
        techniques = (_Prepared(run, fake.materialize(meta), cuda=True), *stack.techniques)
        state = build_state(run, workload, techniques)
        data = batches(workload, run)
        train_step(state, next(data))
        batch = next(data)
        tracker = MemTracker()
        tracker.track_external(state.model, *state.optimizers, *batch)
        with tracker:
            train_step(state, batch)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="vit_l_16")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--techniques", default="baseline,ckpt,opt-in-bwd")
    args = parser.parse_args()
    jobs = [j for j in plan(args.workload, args.techniques, args.batch_size, target_device="cuda", in_process=True,
                            check=False, timeline=False) if j.name in args.techniques.split(",")]
    # Both fill fake tensors' dispatch cache (shared by every FakeTensorMode in a process) on the first run before
    # anything is timed, so that neither pays for it in the other's place.
    predict_memory(jobs[0])
    memtracker_peak(jobs[0])
    rows, total = [], [0.0, 0.0]
    for job in jobs:
        start = time.perf_counter()
        ours = predict_memory(job).peak_allocated_bytes
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        theirs = memtracker_peak(job)
        theirs_s = time.perf_counter() - start
        total[0], total[1] = total[0] + ours_s, total[1] + theirs_s
        rows.append([job.name, f"{ours_s:.2f}", f"{theirs_s:.2f}", f"{theirs_s / ours_s:.1f}x", fmt_bytes(ours),
                     fmt_bytes(theirs)])
        print(f"{job.name}: membench {ours_s:.2f} s, MemTracker {theirs_s:.2f} s", flush=True)
    rows.append(["total", f"{total[0]:.2f}", f"{total[1]:.2f}", f"{total[1] / total[0]:.1f}x", "", ""])
    print(tabulate(rows, headers=["run", "membench s", "MemTracker s", "ratio", "membench peak (512 B blocks)",
                                  "MemTracker peak"], tablefmt="simple", disable_numparse=True))
    print(f"\n{args.workload} batch {args.batch_size}, one process, caches filled first, membench first per run; "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}")


if __name__ == "__main__":
    main()
