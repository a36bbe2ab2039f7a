"""How long one prediction of a 70B-shaped Llama under FSDP takes, and how that grows with its layers.

Llama-2-70B's shape (hidden 8192, FFN 28672, 64 heads, 8 KV heads, vocabulary 32000; Hugging Face's LlamaConfig,
built from its config alone, no weights), FSDP2 over 64 ranks (one process plays rank 0 on the fake process group),
bf16 parameters and fp32 reductions, batch 1 per rank at 4096 tokens, predicted for an H100: `membench.predict.run
.predict`, as `membench predict` runs it, the whole step traced (every block's events; no block is traced once and
repeated). For each layer count asked, prints wall and CPU seconds (process_time: what a loaded machine's wall clock
hides) and the predicted peaks. Timings swing with the machine's load: compare rows of one run, and run it more than
once before quoting a difference. Usage:

    python benchmarks/predict_70b.py [--layers 8,80] [--world-size 64] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from tabulate import tabulate

from membench.common.units import fmt_bytes
from membench.predict.run import predict
from membench.spec import Job, RunSpec

SHAPE = ("hf:llama,hidden_size=8192,intermediate_size=28672,num_attention_heads=64,num_key_value_heads=8,"
         "vocab_size=32000,max_position_embeddings=4096,head=causal-lm")


def one(layers: int, world_size: int) -> tuple[float, float, object]:
    run = RunSpec(f"{SHAPE},num_hidden_layers={layers}", 1, ("fsdp",), device="cuda", seq_len=4096,
                  nproc_per_node=world_size, param_dtype="bf16", reduce_dtype="fp32", gpu="H100")
    wall, cpu = time.perf_counter(), time.process_time()
    record = predict(Job(run))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if record.status != "ok":
        raise SystemExit(f"{layers} layers: {record.status}: {record.error}")
    return wall, cpu, record.memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="8,80", help="layer counts, comma-separated (default 8,80)")
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1, help="predictions per layer count (median printed)")
    args = parser.parse_args()
    rows = []
    for layers in (int(x) for x in args.layers.split(",")):
        runs = [one(layers, args.world_size) for _ in range(args.repeat)]
        memory = runs[-1][2]
        walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
        rows.append([layers, f"{statistics.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f})",
                     f"{statistics.median(cpus):.1f}", fmt_bytes(memory.peak_allocated_bytes),
                     fmt_bytes(memory.peak_reserved_bytes)])
    print(f"Llama-2-70B shape, FSDP2 over {args.world_size} ranks (rank 0), bf16 params / fp32 reduce, batch 1 x "
          f"4096 tokens, predicted for an H100; the whole step traced")
    print(tabulate(rows, headers=["layers", "wall s (min-max)", "CPU s", "predicted peak allocated",
                                  "predicted peak reserved"], tablefmt="simple", disable_numparse=True))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {load:.1f}, "
          f"torch {torch.__version__}; no block traced once and repeated yet (the 15 s goal at 80 layers)")


if __name__ == "__main__":
    main()
