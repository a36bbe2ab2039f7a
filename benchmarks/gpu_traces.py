"""Whole-process CUDA allocator traces of a few of gpu_acceptance.py's runs: on a CUDA machine, every allocation,
free and segment the caching allocator made from the process's start to its last measured step, with Python stacks.

    python benchmarks/gpu_traces.py --out DIR [--jobs N] [--only TEXT]

gpu_acceptance.py's runs record their history only in the recording pass, after the measured steps, under the
storage tracker (a dispatch mode), so their snapshots hold no segment_alloc (every segment was made before) and no
plain step. Here each case runs as `membench run` measures it (build, warm-up, measured steps, the same spec and the
same meter: membench.measure.Session), in its own process, with torch.cuda.memory._record_memory_history on from
before the first CUDA allocation: where the driver put each new segment, in order, and the measured steps' own
events around their peak. Each case writes `<case>.json` (its job, the measured peaks, the environment) and
`<case>.snapshot.pickle.xz` (torch.cuda.memory._snapshot(); opens on pytorch.org/memory_viz once unpacked).
Recording changes no allocation; the peaks are comparable with the same case's gpu_acceptance.py record.

Exit status: 0 every case ran; 1 a case failed (its log says why); 2 bad arguments; 3 no CUDA GPU here.

Committed: results/gpu-traces/ (results/README.md says where they ran). On this CPU, `python
benchmarks/validate_allocator.py DIR` replays such traces (unpacked, each .pickle.xz decompressed) through the
allocator simulator: at the recorded addresses, and at addresses of its own, ascending and top-down.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import pickle
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

NO_GPU_EXIT = 3
MAX_ENTRIES = 3_000_000  # more than any case here makes: the trace keeps the process's first event

# gpu_acceptance.py's cases (its run_checks and attention_model_checks), each with the run of it traced: the same
# workload, batch, sequence, optimizer, steps and warm-up.
LLAMA_SMALL = ("hf:llama,hidden_size=1024,num_hidden_layers=8,num_attention_heads=16,num_key_value_heads=4,"
               "intermediate_size=2816,vocab_size=32000")
CASES: dict[str, dict] = {
    "vit-small_baseline": dict(workload="vit-small", techniques="baseline", batch_size=8),
    "vit-small_adam_opt-in-bwd": dict(workload="vit-small", techniques="opt-in-bwd", batch_size=8, optimizer="adam"),
    "gpt-tiny_baseline": dict(workload="gpt-tiny", techniques="baseline", batch_size=8),
    "vit_b_16_opt-in-bwd": dict(workload="vit_b_16", techniques="opt-in-bwd", batch_size=16),
    "vit_b_16_baseline": dict(workload="vit_b_16", techniques="baseline", batch_size=16),
    "vit_l_16_baseline": dict(workload="vit_l_16", techniques="baseline", batch_size=1),
    "hfgpt2_ckpt": dict(workload="hf:gpt2", techniques="ckpt", batch_size=4, seq_len=512),
    "gpt-small_amp-bf16+ckpt": dict(workload="gpt-small", techniques="amp-bf16+ckpt", batch_size=8),
    "llama-shape_amp-bf16": dict(workload=LLAMA_SMALL, techniques="amp-bf16", batch_size=4, seq_len=1024),
    "vit_b_16_amp-bf16": dict(workload="vit_b_16", techniques="amp-bf16", batch_size=16),
    "vit_l_16_opt-in-bwd": dict(workload="vit_l_16", techniques="opt-in-bwd", batch_size=1),
    "hfgpt2_amp-bf16": dict(workload="hf:gpt2", techniques="amp-bf16", batch_size=4, seq_len=512),
    "hfgpt2_baseline": dict(workload="hf:gpt2", techniques="baseline", batch_size=4, seq_len=512),
    "gpt-small_ckpt": dict(workload="gpt-small", techniques="ckpt", batch_size=8),
    "gpt-small_amp-bf16": dict(workload="gpt-small", techniques="amp-bf16", batch_size=8),
    "llama-shape_amp-bf16+ckpt": dict(workload=LLAMA_SMALL, techniques="amp-bf16+ckpt", batch_size=4,
                                      seq_len=1024),
    "vit-tiny_ckpt": dict(workload="vit-tiny", techniques="ckpt", batch_size=8),
    "vit-tiny_baseline": dict(workload="vit-tiny", techniques="baseline", batch_size=8),
    "vit-tiny_accum": dict(workload="vit-tiny", techniques="accum", batch_size=8),
    "gpt-tiny_ckpt": dict(workload="gpt-tiny", techniques="ckpt", batch_size=8, clip_grad_norm=1.0),
    "vit-small_accum": dict(workload="vit-small", techniques="accum", batch_size=8),
}


def trace_one(name: str, out: Path) -> None:
    """In this process: record from the start, run the case's build, warm-up and measured steps, save the trace."""
    import torch

    from membench import api, environment, private
    from membench.measure import Session
    from membench.step import batches
    from membench.techniques import resolve
    from membench.trackers.memory import make_meter
    from membench.workloads import load_workload

    # Before anything touches CUDA: the trace then holds every segment this process makes, in order.
    private.record_memory_history(max_entries=MAX_ENTRIES, stacks="python", context="alloc")
    case = dict(CASES[name])
    workload_name, techniques, batch_size = case.pop("workload"), case.pop("techniques"), case.pop("batch_size")
    jobs = api.plan(workload_name, techniques, batch_size, device="cuda", steps=2, warmup=1, check=False,
                    timeline=False, predict=False, **case)
    job = next(j for j in jobs if j.name == techniques)
    spec, how = job.run, job.measure
    workload = load_workload(spec.workload, spec.seq_len)
    stack = resolve(spec)
    stack.validate(spec, workload)
    meter = make_meter("cuda", None)
    session = Session(spec, stack, workload, meter, batches(workload, spec, 0, 1))
    started = time.perf_counter()
    build = session.build()
    session.warm_up(how.warmup)
    memory = session.measure(how.steps)[0]
    torch.cuda.synchronize()
    snapshot = private.memory_snapshot()
    private.record_memory_history(enabled=None)
    meter.close()
    events = snapshot["device_traces"][torch.cuda.current_device()]
    with lzma.open(out / f"{name}.snapshot.pickle.xz", "wb", preset=6) as f:
        pickle.dump(snapshot, f, protocol=4)
    record = {"case": name, "job": job.to_dict(), "memory": dataclasses.asdict(memory),
              "build_peak_bytes": build.peak_bytes, "seconds": round(time.perf_counter() - started, 1),
              "trace_events": len(events), "max_entries": MAX_ENTRIES,
              "first_event_is_first_segment": bool(events) and events[0]["action"] == "segment_alloc",
              "environment": dataclasses.asdict(environment.describe("cuda")),
              "cudnn": torch.backends.cudnn.version(), "torch_cuda": torch.version.cuda}
    (out / f"{name}.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"gpu_traces: {name}: peak allocated {memory.peak_allocated_bytes} B, reserved "
          f"{memory.peak_reserved_bytes} B, {len(events)} events", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for each case's .json and snapshot")
    parser.add_argument("--jobs", type=int, default=1, help="cases at a time, each in its own process (default 1)")
    parser.add_argument("--only", default="", help="only the cases whose name contains this text")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: run this case here
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    names = [n for n in CASES if args.only in n]
    if not names:
        parser.error(f"--only {args.only!r} matches no case; cases: {', '.join(CASES)}")
    if args.one is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        trace_one(args.one, args.out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_traces: no CUDA GPU here: nothing traced, exit 3", file=sys.stderr)
        return NO_GPU_EXIT
    args.out.mkdir(parents=True, exist_ok=True)

    def run(name: str) -> int:
        with open(args.out / f"{name}.log", "w") as log:
            code = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--one", name],
                                  stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"gpu_traces: {name}: exit {code}", flush=True)
        return code

    with ThreadPoolExecutor(args.jobs) as pool:
        codes = list(pool.map(run, names))
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
