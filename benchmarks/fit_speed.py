"""How long README's fit example takes, and whether the search from traces gives the full search's answers.

Times `membench fit --workload vit_b_16 --budget 24GiB --techniques accum,ckpt,opt-in-bwd` as a user runs it (a
fresh process: Python, torch, the child that loads the workload, every prediction): wall seconds, and CPU seconds of
the command and its children (what a loaded machine's wall clock hides), with --jobs 1 (one technique after another)
and with the default (one technique per core), in turn; the answers must be the same. With --compare-full, it also
runs the full search (a real prediction at every batch tried: exponential then binary) for each technique in this
process and prints both answers side by side. Timings depend on the machine and its load. Usage:

    python benchmarks/fit_speed.py [--workload vit_b_16] [--budget 24GiB] [--techniques accum,ckpt,opt-in-bwd]
                                   [--compare-full] [--jobs 1,default]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="vit_b_16")
    parser.add_argument("--budget", default="24GiB")
    parser.add_argument("--techniques", default="accum,ckpt,opt-in-bwd")
    parser.add_argument("--compare-full", action="store_true")
    parser.add_argument("--jobs", default="1,default",
                        help="comma-separated --jobs values to time in turn (default: 1,default)")
    args = parser.parse_args()
    command = ["membench", "fit", "--workload", args.workload, "--budget", args.budget, "--techniques",
               args.techniques]

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    tables = set()
    for jobs in args.jobs.split(","):
        # The same command one technique at a time and, by default, one per core: both in this run, so that
        # the machine's load is about the same for the two.
        timed = command + (["--jobs", jobs] if jobs != "default" else [])
        start, cpu = time.perf_counter(), children_cpu()
        proc = subprocess.run([sys.executable, "-m", *timed], capture_output=True, text=True)
        seconds, cpu = time.perf_counter() - start, children_cpu() - cpu
        if proc.returncode:
            sys.exit(f"{' '.join(timed)} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        if proc.stdout not in tables:
            print(proc.stdout)
        tables.add(proc.stdout)
        predictions = sum(line.startswith("fit ") for line in proc.stderr.splitlines())
        for line in proc.stderr.splitlines():  # e.g. that the techniques could not be fitted in parallel here
            if line.startswith("membench: "):
                print(line)
        print(f"`{' '.join(timed)}`: {seconds:.1f} s wall, {cpu:.1f} s CPU (the command and its children), "
              f"{predictions} predictions, from a fresh process ({platform.machine()}, {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}, {torch.get_num_threads()} threads, torch "
              f"{torch.__version__})", flush=True)
    if len(tables) > 1:
        sys.exit("the answers differ between --jobs settings")
    if args.compare_full:
        from membench.api import plan
        from membench.common.units import parse_bytes
        from membench.predict.fit import largest_batch
        from membench.predict.run import predict_memory

        budget = parse_bytes(args.budget)
        for job in plan(args.workload, args.techniques, 4, target_device="cuda", in_process=True, check=False,
                        timeline=False):
            if job.name not in args.techniques.split(","):
                continue
            start, cpu = time.perf_counter(), time.process_time()
            fit = largest_batch(job, budget, lambda j: predict_memory(j).peak_reserved_bytes)
            print(f"full search {job.name}: max batch {fit.batch}, first over {fit.over_batch}, {fit.probes} "
                  f"predictions, {time.process_time() - cpu:.1f} s CPU, {time.perf_counter() - start:.1f} s wall",
                  flush=True)


if __name__ == "__main__":
    main()
