"""torchtitan's FSDP2 row (pytorch/torchtitan pull request #165, as issue 45 quotes it) beside membench's prediction.

    python benchmarks/torchtitan_pr165.py

The row: the Llama-2 7B shape on 8 H100s, local batch 8, sequence 2048, bf16 parameters, fp32 reduce-scatter, full
activation checkpointing, with expandable segments (torchtitan's launch script sets
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): peak active 22.73 GiB, peak reserved 31.02 GiB.

Predicted here: Hugging Face's LlamaForCausalLM in Llama-2 7B's shape (hidden 4096, FFN 11008, 32 layers, 32 heads,
vocabulary 32000), not torchtitan's own model code, under membench's fsdp+ckpt+expandable-segments (ckpt wraps each
block as torchtitan's full AC does), AdamW, rank 0 of 8. Peak active is compared with the predicted peak allocated
(a prediction has no record_stream delays, so active and allocated coincide). What this does not model and why the
figures can differ: see docs/predict.md. Prints both and each error; exit 0 always (a comparison, not a gate).
"""

from __future__ import annotations

import os
import platform
import time

import torch
from tabulate import tabulate

from membench.common.units import fmt_bytes
from membench.predict.run import predict
from membench.spec import Job, RunSpec

SOURCE = "pytorch/torchtitan #165 (FSDP2), as quoted by membench issue 45"
PUBLISHED = {"peak active": int(22.73 * 2**30), "peak reserved": int(31.02 * 2**30)}
WORKLOAD = ("hf:llama,hidden_size=4096,intermediate_size=11008,num_hidden_layers=32,num_attention_heads=32,"
            "num_key_value_heads=32,vocab_size=32000,max_position_embeddings=2048,head=causal-lm")


def main() -> int:
    run = RunSpec(WORKLOAD, 8, ("fsdp", "ckpt", "expandable-segments"), device="cuda", seq_len=2048,
                  nproc_per_node=8, optimizer="adamw", param_dtype="bf16", reduce_dtype="fp32", gpu="H100")
    started = time.perf_counter()
    record = predict(Job(run))
    wall = time.perf_counter() - started
    if record.status != "ok":
        print(f"prediction failed: {record.error}")
        return 1
    m = record.memory
    predicted = {"peak active": m.peak_allocated_bytes, "peak reserved": m.peak_reserved_bytes}
    rows = [[what, fmt_bytes(PUBLISHED[what]), fmt_bytes(predicted[what]),
             f"{(predicted[what] - PUBLISHED[what]) / PUBLISHED[what]:+.1%}"] for what in PUBLISHED]
    print(tabulate(rows, headers=["rank 0 of 8", "published", "predicted", "error"], tablefmt="simple",
                   disable_numparse=True))
    print(f"\npublished: {SOURCE}; predicted: {run.workload}, fsdp+ckpt+expandable-segments, {wall:.0f} s wall")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.machine()}, {os.cpu_count()} cores, load {load:.1f}, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
