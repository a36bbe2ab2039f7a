"""membench's sharded-training prediction against a published multi-GPU memory figure whose settings are all given.

    python benchmarks/validate_sharded.py

The figure: torchtitan's docs/performance.md, Table 1 ("1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local
batch size 2, global batch size 16. Selective activation checkpointing."), row "FSDP": Memory 82.4 GiB on H100s of
96 GB. Its counter is torch.cuda.max_memory_reserved (torchtitan's metrics log `max_reserved_gib` as "memory"),
read at the 90th step, where its readings are stable. The rest of the run is torchtitan's llama3_8b.toml: sequence
length 8192, AdamW (lr 3e-4, eps 1e-8), gradient clipping at norm 1.0, FSDP2 over all 8 ranks with bf16 parameters
and fp32 reductions (torchtitan's mixed-precision defaults), selective activation checkpointing by op.

Predicted here: Hugging Face's LlamaForCausalLM in Llama 3.1 8B's shape (hidden 4096, FFN 14336, 32 layers,
32 heads, 8 KV heads, vocabulary 128256), which is not torchtitan's own Llama code but the same layers and sizes,
under membench's fsdp. torchtitan's op-level policy keeps every matmul's output but every second one of the
feed-forward and attention projections (it recomputes those), more than full checkpointing keeps and less than
membench's sac (which keeps every matmul and attention output): so the published figure is checked against the
bracket the two make, fsdp+ckpt below and fsdp+sac above. Also not modelled: torchtitan shards the embeddings and
the norm + output head as their own FSDP units (membench: each block and the root), and keeps the last block
unsharded after forward. Prints each prediction, the published figure, and whether it lies in the bracket; exit 0
when it does, 1 otherwise.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import torch
from tabulate import tabulate

from membench.common.units import fmt_bytes
from membench.predict.run import predict
from membench.spec import Job, RunSpec

SOURCE = ("torchtitan docs/performance.md Table 1, row FSDP (Llama 3.1 8B, 8 H100 96 GB, local batch 2, seq 8192, "
          "selective op AC; max_memory_reserved)")
PUBLISHED_GIB = 82.4
WORKLOAD = ("hf:llama,hidden_size=4096,intermediate_size=14336,num_hidden_layers=32,num_attention_heads=32,"
            "num_key_value_heads=8,vocab_size=128256,max_position_embeddings=8192,head=causal-lm")


def job(techniques: tuple[str, ...]) -> Job:
    return Job(RunSpec(WORKLOAD, 2, techniques, device="cuda", seq_len=8192, nproc_per_node=8, optimizer="adamw",
                       lr=3e-4, clip_grad_norm=1.0, param_dtype="bf16", reduce_dtype="fp32", gpu="H100"))


def main() -> int:
    rows, reserved = [], {}
    for techniques in (("fsdp", "ckpt"), ("fsdp", "sac")):
        started = time.perf_counter()
        record = predict(job(techniques))
        wall = time.perf_counter() - started
        name = "+".join(techniques)
        if record.status != "ok":
            print(f"{name}: {record.status}: {record.error}", file=sys.stderr)
            return 1
        reserved[name] = record.memory.peak_reserved_bytes
        rows.append([name, fmt_bytes(record.memory.peak_allocated_bytes), fmt_bytes(reserved[name]), f"{wall:.0f}"])
    low, high = reserved["fsdp+ckpt"], reserved["fsdp+sac"]
    published = int(PUBLISHED_GIB * 2**30)
    inside = low <= published <= high
    print(tabulate(rows, headers=["prediction (rank 0 of 8)", "peak allocated", "peak reserved", "wall s"],
                   tablefmt="simple", disable_numparse=True))
    print(f"\npublished: {PUBLISHED_GIB} GiB reserved ({SOURCE})")
    print(f"in the bracket fsdp+ckpt .. fsdp+sac ({fmt_bytes(low)} .. {fmt_bytes(high)}): {'yes' if inside else 'no'}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.machine()}, {os.cpu_count()} cores, load {load:.1f}, torch {torch.__version__}")
    return 0 if inside else 1


if __name__ == "__main__":
    sys.exit(main())
