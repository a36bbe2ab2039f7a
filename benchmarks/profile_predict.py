"""Where a prediction's seconds go: imports, the first prediction in a process (cold), the same one again (warm),
with and without torch's fake-tensor dispatch cache, and the functions that take the most time (cProfile).

The first prediction in a process pays for torch's lazy setup (decompositions, the fake-tensor dispatch cache filling
up); `membench fit` runs all its predictions in one child, so only its first one pays. The cache
(torch._dynamo.config.fake_tensor_cache_enabled) is on by default; its entries are shared by every FakeTensorMode in the
process. CPU seconds (process_time) are printed beside wall seconds: on a loaded machine wall time says little.
Peaks are printed for each run: turning the cache off must not change them. Usage:

    python benchmarks/profile_predict.py [--workload vit_l_16] [--batch-size 1] [--techniques baseline]
                                         [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import time

_start = (time.perf_counter(), time.process_time())

import torch  # noqa: E402 - timed: imports are part of a prediction's cost

from membench.api import plan  # noqa: E402
from membench.predict.run import predict_memory  # noqa: E402
from membench.private import fake_tensor_cache_info, set_fake_tensor_cache  # noqa: E402

_imported = (time.perf_counter(), time.process_time())


def timed(job, cache: bool, profile: cProfile.Profile | None = None):
    set_fake_tensor_cache(cache)
    wall, cpu = time.perf_counter(), time.process_time()
    if profile:
        profile.enable()
    memory = predict_memory(job)
    if profile:
        profile.disable()
    return time.perf_counter() - wall, time.process_time() - cpu, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="vit_l_16")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--techniques", default="baseline")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"imports: {_imported[0] - _start[0]:.2f} s wall, {_imported[1] - _start[1]:.2f} s CPU")
    for job in plan(workload=args.workload, techniques=args.techniques, batch_size=args.batch_size,
                    target_device="cuda", in_process=True):
        profile = cProfile.Profile()
        runs = [("cold, cache on", timed(job, True, profile)), ("warm, cache on", timed(job, True)),
                ("warm, cache off", timed(job, False)), ("warm, cache on", timed(job, True))]
        for label, (wall, cpu, memory) in runs:
            print(f"{job.name} {label}: {wall:.2f} s wall, {cpu:.2f} s CPU; peak allocated "
                  f"{memory.peak_allocated_bytes} B, reserved {memory.peak_reserved_bytes} B")
        print(f"fake-tensor dispatch cache: {fake_tensor_cache_info()}")
        print(f"cold run, top {args.top} by cumulative time (cProfile adds overhead):")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
