"""A compiled training step on CPU: measured eager, measured compiled, and predicted compiled, side by side.

    python benchmarks/compiled_cpu.py [--batch-size 4] [WORKLOAD ...]

Each workload's step is measured by membench's own Session (build, two warm-up steps, the measured step) on real
tensors: once eager under the storage tracker, once with the compile technique (torch.compile, Inductor's CPU
backend) under the tracker for compiled steps (trackers/compiled.py, which counts Inductor's own buffers). Then the
compiled step is predicted for cpu on fake tensors (predict/compiled.py: AOTAutograd's partition as Inductor makes
it, run op by op). Prints the three peaks in bytes, the prediction's error against the compiled measurement, and
the bytes the partitioner saves for backward. Set TORCHINDUCTOR_CACHE_DIR to keep Inductor's cache between runs.
Compiling takes minutes per workload on a 2-core machine.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from membench.measure import Session  # noqa: E402
from membench.predict.run import predict  # noqa: E402
from membench.spec import Job, MeasureSpec, RunSpec  # noqa: E402
from membench.step import batches  # noqa: E402
from membench.techniques import resolve  # noqa: E402
from membench.trackers.memory import CpuMeter  # noqa: E402
from membench.workloads import load_workload  # noqa: E402

SPLIT = ("activations", "temporaries")  # where a compiled step and its prediction part ways
WORKLOADS = ("gpt-tiny", "vit-tiny", "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=256,n_positions=128")


def measured(run: RunSpec):
    """The step's memory as `membench run --device cpu` measures it (in this process)."""
    workload = load_workload(run.workload, run.seq_len)
    stack = resolve(run)
    stack.validate(run, workload)
    session = Session(run, stack, workload, CpuMeter(compiled=stack.compiles), batches(workload, run))
    session.build()
    session.warm_up(2)
    memory = session.measure(1)[0]
    session.release()
    return memory


def row(workload: str, batch_size: int) -> list:
    eager = RunSpec(workload=workload, batch_size=batch_size).validated()
    compiled = RunSpec(workload=workload, batch_size=batch_size, techniques=("compile",)).validated()
    eager_memory, compiled_memory = measured(eager), measured(compiled)
    record = predict(Job(compiled, MeasureSpec(warmup=2, steps=1, check=False)).validated())
    name = workload.split(",")[0]
    if record.status != "ok":
        return [name, eager_memory.peak_allocated_bytes, compiled_memory.peak_allocated_bytes,
                f"{record.status}: {record.error}", "", "", ""]
    predicted, compiled_bytes = record.memory.peak_allocated_bytes, compiled_memory.peak_allocated_bytes
    saved = sum(s.bytes for s in record.compiled.saved if not s.name.startswith("primals_"))
    at_peak = " / ".join(f"{m.breakdown_at_peak[c]:,}" for m in (compiled_memory, record.memory) for c in SPLIT)
    return [name, f"{eager_memory.peak_allocated_bytes:,}", f"{compiled_bytes:,}", f"{predicted:,}",
            f"{(predicted - compiled_bytes) / compiled_bytes:+.1%}", f"{saved:,}", at_peak]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args(argv)
    rows = [row(w, args.batch_size) for w in args.workloads]
    print(tabulate(rows, headers=["workload", "eager measured B", "compiled measured B", "compiled predicted B",
                                  "predicted vs measured", "saved for backward B (not inputs)",
                                  "at the peak: activations, temporaries measured / predicted B"]))
    print(f"\nbatch {args.batch_size}, CPU ({platform.machine()}, {torch.get_num_threads()} threads), "
          f"torch {torch.__version__}; measured peaks are exact (storage tracker), the prediction on fake tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
