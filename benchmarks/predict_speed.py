"""How fast a prediction is, against torch's MemTracker on the same steps, side by side in one run.

For each configuration (technique stack) of one workload, both start from the model built on `meta` and run the
same training step code (membench.step) on fake tensors, with the same techniques, batches and optimizer:

- membench: `predict_memory` as `membench predict` runs it (the measured step under the storage tracker, every
  allocation traced, after a warm-up step written from it where membench.predict.steady can, else run; reserved memory
  from the allocator simulator over both);
- MemTracker (torch.distributed._tools.mem_tracker) under the same FakeTensorMode: a warm-up step, then the step
  tracked as its documentation shows (track_external on the model and optimizers).

Prints CPU seconds (process_time: what a loaded machine's wall clock hides) and wall seconds per configuration for
each, their ratio, and both peaks (membench's rounded to CUDA's 512-byte
blocks, MemTracker's unrounded: they differ by that rounding). Timings depend on the machine and its load: compare
ratios from one run. Usage:

    python benchmarks/predict_speed.py [--workload vit_l_16] [--batch-size 1] [--techniques baseline,ckpt,opt-in-bwd]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time

import torch
from tabulate import tabulate

from membench.api import plan
from membench.common.units import fmt_bytes
from membench.predict.emulate import fake
from membench.predict.run import _Prepared, predict_memory
from membench.step import batches, build_state, train_step
from membench.techniques import resolve
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
    rows, total = [], [0.0, 0.0, 0.0, 0.0]
    for job in jobs:
        wall, cpu = time.perf_counter(), time.process_time()
        ours = predict_memory(job).peak_allocated_bytes
        ours_s, ours_cpu = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        theirs = memtracker_peak(job)
        theirs_s, theirs_cpu = time.perf_counter() - wall, time.process_time() - cpu
        for i, v in enumerate((ours_s, theirs_s, ours_cpu, theirs_cpu)):
            total[i] += v
        rows.append([job.name, f"{ours_cpu:.2f}", f"{theirs_cpu:.2f}", f"{theirs_cpu / ours_cpu:.1f}x",
                     f"{ours_s:.2f}", f"{theirs_s:.2f}", fmt_bytes(ours), fmt_bytes(theirs)])
        print(f"{job.name}: membench {ours_cpu:.2f} s CPU ({ours_s:.2f} s wall), MemTracker {theirs_cpu:.2f} s CPU "
              f"({theirs_s:.2f} s wall)", flush=True)
    rows.append(["total", f"{total[2]:.2f}", f"{total[3]:.2f}", f"{total[3] / total[2]:.1f}x", f"{total[0]:.2f}",
                 f"{total[1]:.2f}", "", ""])
    print(tabulate(rows, headers=["run", "membench CPU s", "MemTracker CPU s", "ratio (CPU)", "membench wall s",
                                  "MemTracker wall s", "membench peak (512 B blocks)", "MemTracker peak"],
                   tablefmt="simple", disable_numparse=True))
    print(f"\n{args.workload} batch {args.batch_size}, one process, caches filled first, membench first per run; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}, {torch.get_num_threads()} threads, torch {torch.__version__}")

if __name__ == "__main__":
    main()
