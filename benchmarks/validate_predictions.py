"""Check membench's CUDA predictions against real GPU traces of a model whose exact code is public.

    python benchmarks/validate_predictions.py [--truth ../shared/gpu-truth] [--skip-hf | --hf-only] [--events]

The folder (development data beside the repository, not shipped; see its README) holds eight
`torch.cuda.memory._dump_snapshot` pickles recorded on a real GPU (torch 2.11) by a public script, and the model
code that made them: the CS336 staff `BasicsTransformerLM` "medium" at contexts 128 to 1024, training steps and
inference forwards, three of them under bf16 autocast. For each, the script's own sequence (its warm-up batches
kept on the GPU, its warm-up steps, the recorded step with its output and loss kept alive) runs on membench's
prediction engine: fake tensors on CPU, the exact storage tracker at the CUDA allocator's 512-byte blocks, CUDA's
autocast policy (predict/emulate/autocast.py), cuBLAS's workspaces (predict/emulate/kernels.py), the in-place
backward paths of a plain run (predict/emulate/inplace_backward.py) and the scratch CUDA kernels take and free
(predict/emulate/reductions.py), then the
caching-allocator simulator for reserved memory. The real numbers come from the trace: its events replayed from
the allocator state at its start (the blocks alive before recording began) give the peak allocated and reserved
that `max_memory_allocated()` / `max_memory_reserved()` reported. Prints predicted vs real and the error; exit 0
when every peak allocated is equal to the byte, 1 otherwise, 3 (NOTHING_CHECKED) with a line saying so when the folder
is absent: a script that checked nothing must not pass for one that checked.

Then (unless --skip-hf; needs transformers) the seven published rows of the Hugging Face performance doc, each
predicted as today's torch and transformers train and as the doc's January 2022 software did, for either torch
its date allows (software_2022.py: what torch 1.10 or 1.9 and transformers 4.18 kept that today's do not).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from membench.allocator import TraceEvent, simulate  # noqa: E402
from membench.allocator.replay import actual_of, replay  # noqa: E402
from membench.allocator.snapshot import ALLOC, FREE, initial_state, load_snapshot  # noqa: E402
from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels, cuda_gpu  # noqa: E402
from membench.trackers.storage import StorageTracker  # noqa: E402

DEFAULT_TRUTH = Path(__file__).resolve().parents[1].parent / "shared" / "gpu-truth"
TRACE_WORKSPACE = 8_519_680  # the traces' GPU gave each cuBLAS handle this (their README): not Hopper
# Which GPU the traces ran on is not recorded. torch 2.11 gives a cuBLAS handle 32 MiB on sm90/sm100/sm120, so the
# 8,519,680 B workspace rules out the H100 (SXM and PCIe) and H200; so does cub's 72,191-byte sort storage at
# ctx1024 (sm90's tuning would take 71,167 B). A GPU of sm70-sm89 with at least 25.2 GB (the peak reserved) and
# enough multiprocessors (32 at 2048 threads each, 43 at 1536) gives every scratch size seen in the traces:
# A100, A6000/A40/L40(S), V100-32GB all do. The A100 stands for them.
TRACE_GPU = gpus.gpu("A100")
BATCH, WARMUP, VOCAB = 4, 5, 10_000
CASES = [(ctx, kind, autocast) for ctx in (128, 256, 512, 1024) for kind in ("inference", "training")
         for autocast in [ctx in (512, 1024) and (kind == "training" or ctx == 512)]]


def predicted(truth: Path, ctx: int, training: bool, autocast: bool) -> tuple[int, int]:
    """(peak allocated, peak reserved) after the script's reset_peak_memory_stats(), predicted; see the module's
    docstring."""
    result = simulate(predicted_trace(truth, ctx, training, autocast))
    return result.peak_allocated_bytes, result.peak_reserved_bytes


def predicted_trace(truth: Path, ctx: int, training: bool, autocast: bool) -> list[TraceEvent]:
    """The whole process's predicted allocations and frees, with a reset_peak event where the script reset them."""
    sys.path.insert(0, str(truth))
    from cs336_basics.model import BasicsTransformerLM
    from cs336_basics.nn_utils import cross_entropy
    from cs336_basics.optimizer import AdamW

    # Built on meta and made fake, as `membench predict` builds (initialisers that loop on values cannot run fake).
    meta = fake.build_on_meta(lambda: BasicsTransformerLM(vocab_size=VOCAB, context_length=ctx, d_model=1024,
                                                          num_layers=24, num_heads=16, d_ff=4096))
    with fake.fake_tensors(), cuda_gpu():
        tracker = StorageTracker(round_to=512, trace=True)
        tracker.kernels = CudaKernels(TRACE_GPU, TRACE_WORKSPACE)
        with tracker:
            model = fake.materialize(meta)
            optimizer = AdamW(model.parameters())
            autocast_on = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)  # noqa: E731
            warm_inputs = torch.randint(0, VOCAB, (WARMUP, BATCH, ctx))
            inputs = torch.randint(0, VOCAB, (1, BATCH, ctx))
            if training:
                warm_targets = torch.randint(0, VOCAB, (WARMUP, BATCH, ctx))
                targets = torch.randint(0, VOCAB, (1, BATCH, ctx))
                model.train()
                for i in range(WARMUP):
                    with autocast_on():
                        output = model(warm_inputs[i])
                        loss = cross_entropy(output, warm_targets[i])
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                del output, loss
                optimizer.zero_grad(set_to_none=True)
                tracker.reset_peak()
                start = len(tracker.trace)
                with autocast_on():
                    output = model(inputs[0])
                    loss = cross_entropy(output, targets[0])
                loss.backward()
                optimizer.step()
            else:
                model.eval()
                with torch.inference_mode():
                    for i in range(WARMUP):
                        with autocast_on():
                            model(warm_inputs[i])
                    tracker.reset_peak()
                    start = len(tracker.trace)
                    with autocast_on():
                        model(inputs[0])
    # The whole process's allocations through the allocator simulator, its peaks reset where the script reset
    # them: max_memory_allocated() counts whole blocks (a large block keeps a remainder of up to 1 MiB unsplit).
    return [*tracker.trace[:start], TraceEvent("reset_peak"), *tracker.trace[start:]]


def recorded_step_events(trace: list[TraceEvent]) -> list[tuple[str, int]]:
    """A predicted trace's events after its reset, as ("alloc" | "free", requested bytes)."""
    sizes, events, recording = {}, [], False
    for event in trace:
        if event.kind == "alloc":
            sizes[event.key] = event.size
        if recording and event.kind in ("alloc", "free"):
            events.append((event.kind, sizes[event.key]))
        recording = recording or event.kind == "reset_peak"
    return events


def real_events(path: Path) -> list[tuple[str, int]]:
    """The trace's allocations and completed frees, as ("alloc" | "free", requested bytes)."""
    return [("alloc" if e["action"] == ALLOC else "free", e["size"])
            for e in load_snapshot(path)["device_traces"][0] if e["action"] in (ALLOC, FREE)]


def event_differences(real_step: list, predicted_step: list, most: int = 5) -> list[str]:
    """Where the two sequences of events differ (difflib's opcodes), a line each, at most `most`."""
    matcher = difflib.SequenceMatcher(None, real_step, predicted_step, autojunk=False)
    lines = [f"  {tag}: real[{i1}:{i2}] {real_step[i1:i2][:6]} / predicted[{j1}:{j2}] {predicted_step[j1:j2][:6]}"
             for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    return lines[:most] + ([f"  ... {len(lines) - most} more"] if len(lines) > most else [])


def real(path: Path) -> tuple[int, int, int]:
    """(peak allocated, peak reserved, reserved before recording) from the trace."""
    trace = initial_state(load_snapshot(path))
    result = replay(trace)
    return result.peak_allocated_bytes, actual_of(trace).peak_reserved_bytes, actual_of(trace).initial_reserved_bytes


# The Hugging Face performance doc behind the project's first seed (transformers v4.18, "Performance and
# Scalability"): the Trainer on bert-large-uncased, sequence classification, sequence length 512, on a V100 16 GB;
# NVML's "GPU memory occupied", which includes the 1343 MB of CUDA context and kernels the doc measures itself.
# The Trainer of that doc keeps zeroed gradients (zero_grad without set_to_none), steps a per-parameter AdamW loop
# (foreach-off) and clips gradients to norm 1.0. Rows: (setting, techniques, optimizer, published MB).
HF_WORKLOAD = ("hf:bert,hidden_size=1024,num_hidden_layers=24,num_attention_heads=16,intermediate_size=4096,"
               "head=seq-cls,_attn_implementation=eager")
HF_CONTEXT_MB = 1343
HF_ROWS = [
    ("batch 4", "foreach-off", "adamw", 14949),
    ("batch 1, accumulation 4", "accum+foreach-off", "adamw", 8681),
    ("+ gradient checkpointing", "accum+ckpt+foreach-off", "adamw", 6775),
    ("batch 4, fp16", "amp-fp16+foreach-off", "adamw", 13939),
    ("batch 1, accum 4, ckpt, fp16", "accum+ckpt+amp-fp16+foreach-off", "adamw", 7275),
    ("batch 4, Adafactor", "baseline", "adafactor", 12295),
    ("batch 1, accum 4, ckpt, fp16, Adafactor", "accum+ckpt+amp-fp16", "adafactor", 4847),
]


def hf_predictions() -> list[tuple[str, int, list[float], float]]:
    """Each published row against `membench predict`'s reserved memory (+ the doc's own context figure), in MB: as
    today's torch and transformers train, and with what the doc's software kept that they do not, for either torch
    its date allows (software_2022.py). (setting, published MB, [today, as 1.10, as 1.9], seconds per prediction)."""
    from software_2022 import early_2022

    from membench.api import plan
    from membench.predict.run import predict_memory

    def predicted_mb(techniques: str, optimizer: str) -> float:
        # "a+b" is one run with both techniques (a stack); plan puts the baseline first.
        [*_, job] = plan(HF_WORKLOAD, techniques, 4, device="cpu", target_device="cuda", seq_len=512,
                         optimizer=optimizer, accum_steps=4, zero_grad="zeros", clip_grad_norm=1.0, gpu="V100",
                         check=False, timeline=False, in_process=True)
        return predict_memory(job).peak_reserved_bytes / 2**20 + HF_CONTEXT_MB

    rows = []
    for setting, techniques, optimizer, published in HF_ROWS:
        started = time.perf_counter()
        mbs = []
        for software in (contextlib.nullcontext(), early_2022("1.10"), early_2022("1.9")):
            with software:
                mbs.append(predicted_mb(techniques, optimizer))
        rows.append((setting, published, mbs, (time.perf_counter() - started) / 3))
    return rows


def hf_rows() -> list[list]:
    """hf_predictions as the table prints them."""
    return [[setting, published, *[x for mb in mbs for x in (f"{mb:,.0f}", f"{(mb - published) / published:+.1%}")],
             f"{seconds:.1f}"] for setting, published, mbs, seconds in hf_predictions()]


NOTHING_CHECKED = 3  # the traces' folder is absent: nothing was compared with a real GPU

HF_HEADERS = ["Trainer setting", "published MB", "predicted MB", "error", "as torch 1.10 + v4.18", "error",
              "as torch 1.9 + v4.18", "error", "predict s"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--truth", type=Path, default=DEFAULT_TRUTH)
    parser.add_argument("--skip-hf", action="store_true", help="leave out the Hugging Face table (needs transformers)")
    parser.add_argument("--hf-only", action="store_true", help="only the Hugging Face table")
    parser.add_argument("--events", action="store_true",
                        help="also compare each recorded step's allocations and frees (requested sizes, in order) "
                             "with the prediction's, and print where they differ")
    args = parser.parse_args(argv)
    if args.hf_only:  # the published rows are in this script: no folder needed
        print(tabulate(hf_rows(), headers=HF_HEADERS))
        return 0
    traces = args.truth / "traces"
    if not traces.is_dir():
        print(f"validate_predictions: {traces} is absent (the real GPU traces are development data beside the "
              f"repository, not shipped): nothing checked, exit {NOTHING_CHECKED}; --truth names the folder",
              file=sys.stderr)
        return NOTHING_CHECKED
    rows, exact, compared = [], True, []
    for ctx, kind, autocast in CASES:
        path = traces / f"medium_{ctx}_{kind}_memory_snapshot.pickle"
        started = time.perf_counter()
        trace = predicted_trace(args.truth, ctx, kind == "training", autocast)
        result = simulate(trace)
        p_alloc, p_res = result.peak_allocated_bytes, result.peak_reserved_bytes
        seconds = time.perf_counter() - started
        r_alloc, r_res, _ = real(path)
        exact &= p_alloc == r_alloc
        rows.append([f"medium ctx{ctx} {kind}" + (" bf16 autocast" if autocast else ""), f"{r_alloc:,}",
                     f"{p_alloc:,}", f"{p_alloc - r_alloc:+,}", f"{(p_alloc - r_alloc) / r_alloc:+.2%}",
                     f"{r_res:,}", f"{p_res:,}", f"{(p_res - r_res) / r_res:+.2%}", f"{seconds:.1f}"])
        if args.events:
            real_step, predicted_step = real_events(path), recorded_step_events(trace)
            differences = event_differences(real_step, predicted_step)
            compared.append(f"{rows[-1][0]}: {len(real_step)} events recorded, {len(predicted_step)} predicted"
                            + (", the same" if not differences else "; where they differ:"))
            compared.extend(differences)
    print(tabulate(rows, headers=["trace", "real peak alloc B", "predicted B", "diff B", "error",
                                  "real peak reserved B", "predicted B", "error", "predict s"]))
    if compared:
        print("\nEach recorded step's allocations and frees (requested bytes, in order), real vs predicted:")
        print("\n".join(compared))
    print(f"\ntorch {torch.__version__} on this machine's CPU (fake tensors); real: the traces' GPU, torch 2.11")
    if not args.skip_hf:
        print("\nHugging Face performance doc (bert-large, seq 512, V100; published NVML MB vs predicted reserved + "
              f"the doc's {HF_CONTEXT_MB} MB of context; as today's torch and transformers train, and with what the "
              "doc's torch (1.10 or 1.9) and transformers 4.18 kept that they do not, benchmarks/software_2022.py):\n")
        print(tabulate(hf_rows(), headers=HF_HEADERS))
    return 0 if exact else 1


def write_doc(argv: list[str]) -> int:
    """`--write-doc`: run as asked and write what it printed into docs/accuracy.md's section of this script."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import doc_section

    rest = [a for a in argv if a != "--write-doc"]
    return doc_section.run_and_write(lambda: main(rest), doc_section.ACCURACY,
                                     "benchmarks/validate_predictions.py --write-doc")


if __name__ == "__main__":
    sys.exit(write_doc(sys.argv[1:]) if "--write-doc" in sys.argv else main(sys.argv[1:]))
