"""The GPU acceptance run: on any CUDA machine, in under ten minutes, check the facts membench's CUDA path depends
on, and write one results file that can be committed under results/.

    python benchmarks/gpu_acceptance.py [--out results/gpu-acceptance] [--quick] [--jobs N] [--keep DIR]

Each check runs on its own (one failing never stops the others) and is recorded as `pass`, `fail` (what was
expected and what was found), `recorded` (a figure the GPU gives, for the docs, with nothing to compare it with)
or `error` (the check itself raised). docs/measurement.md says what each check means. --quick leaves out the
vit-small runs, the attention models' runs and the `-m gpu` tests. --jobs runs that many of the membench-run checks
at a time (each in its own processes: their memory is their own, but their timings are not comparable, and this
script reports none); --keep keeps their results folders (records, CUDA snapshots, the predictions beside them).

Exit status: 0 every check passed or recorded; 1 a check failed or raised (the file says which); 2 bad arguments;
3 no CUDA GPU here: the script stops before checking anything, says so in one line, and writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's membench, run from anywhere

import torch  # noqa: E402

NO_GPU_EXIT = 3
ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


@dataclasses.dataclass
class Check:
    name: str
    status: str  # "pass", "fail", "recorded", "error"
    detail: str
    figures: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


def _verdict(name: str, ok: bool, detail: str, **figures) -> Check:
    return Check(name, "pass" if ok else "fail", detail, figures)


def _round512(n: int) -> int:
    return -(-n // 512) * 512


# --- facts of the GPU and of torch -----------------------------------------------------------------------------
def check_versions() -> Check:
    """The GPU's own figures against membench's table (predict/gpus.py), as the prediction beside each run picks
    its entry (predict/beside.target_for)."""
    from membench.predict import beside, gpus

    device = torch.cuda.current_device()
    p, name = torch.cuda.get_device_properties(device), torch.cuda.get_device_name(device)
    figures = {"gpu": name, "compute_capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
               "max_threads_per_sm": p.max_threads_per_multi_processor, "total_memory_bytes": p.total_memory,
               "torch": torch.__version__, "cuda": torch.version.cuda,
               "cudnn": torch.backends.cudnn.version(), "driver": _driver()}
    target = beside.target_for("cuda", p, name)
    if isinstance(target, str):
        return _verdict("versions and the GPU table", False, target, **figures)
    entry = gpus.GPUS[target.gpu]
    same = (entry.compute_capability == (p.major, p.minor) and entry.sm_count == p.multi_processor_count
            and entry.max_threads_per_sm == p.max_threads_per_multi_processor)
    return _verdict("versions and the GPU table", same, f"table entry {target.described}", table_entry=entry.name,
                    **figures)


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def check_cublas_workspace() -> Check:
    """The first matmul of a process: how much the caching allocator gives cuBLAS beyond the output (the
    prediction adds gpus.cublas_workspace_bytes through the allocator, per handle and stream)."""
    from membench.predict import gpus

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    a = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = a @ a
    torch.cuda.synchronize()
    grew = torch.cuda.memory_allocated() - before - _round512(out.untyped_storage().nbytes())
    expected = gpus.cublas_workspace_bytes((p.major, p.minor))
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return _verdict("cuBLAS workspace", grew == expected,
                    f"through the caching allocator: {grew:,} B (membench assumes {expected:,} B"
                    f"{', CUBLAS_WORKSPACE_CONFIG=' + env if env else ''})", allocated_bytes=grew,
                    assumed_bytes=expected)


def check_adam_step_device() -> Check:
    """Adam's `step` counter: a host tensor unless capturable or fused (torch/optim/adam.py, _init_group), so it
    is no device memory; the prediction counts it on the host."""
    model = torch.nn.Linear(8, 8, device="cuda")
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    opt.step()
    devices = sorted({str(s["step"].device) for s in opt.state.values()})
    return _verdict("Adam's step device", devices == ["cpu"], f"state['step'] on {devices}", devices=devices)


def check_sdpa() -> Check:
    """Which kernel scaled_dot_product_attention picks for gpt-tiny-like shapes (fp32 and bf16, causal), and the
    memory its backward takes beyond what the forward kept, beside what a prediction of the same call gives
    (predict/emulate/attention_kernels.py; cuDNN's engine workspace beyond its frontend's is assumed 0): recorded."""
    from membench import private

    figures = {}
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(4, 4, 256, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        backend = private.sdpa_backend(q, k, v, is_causal=True)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out.sum().backward()
        torch.cuda.synchronize()
        scratch = torch.cuda.max_memory_allocated() - kept
        predicted_backend, predicted = _predicted_sdpa_scratch(dtype)
        figures[str(dtype).removeprefix("torch.")] = {
            "backend": backend, "backward_peak_over_kept_bytes": scratch,
            "predicted_backend": predicted_backend, "predicted_backward_peak_over_kept_bytes": predicted}
    quadratic = 4 * 4 * 256 * 256 * 4  # one fp32 queries x keys matrix
    fused = all(f["backend"] != "MATH" for f in figures.values())
    return _verdict("SDPA backend and backward scratch", fused, f"backends {figures}; a queries x keys fp32 "
                    f"matrix would be {quadratic:,} B", **figures)


def _predicted_sdpa_scratch(dtype) -> tuple[str, int]:
    """The same call on fake tensors for this GPU's table entry: (backend, backward's peak over what forward
    kept, in 512-byte blocks)."""
    import torch.nn.functional as F

    from membench.predict.beside import target_for
    from membench.predict.emulate import fake
    from membench.predict.emulate.kernels import cuda_gpu
    from membench.predict.emulate.sdpa import CudaSdpa
    from membench.predict.gpus import GPUS
    from membench.trackers.storage import StorageTracker

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    gpu = GPUS[target_for("cuda", p, torch.cuda.get_device_name()).gpu]
    with cuda_gpu(gpu, workspace_bytes=0) as kernels, fake.fake_tensors():
        sites = kernels.find(CudaSdpa).sites
        q, k, v = (torch.randn(4, 4, 256, 64, dtype=dtype, requires_grad=True) for _ in range(3))
        tracker = StorageTracker(round_to=512)
        tracker.kernels = kernels
        with tracker:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            kept = tracker.current
            tracker.peak.bytes = 0
            out.sum().backward()
        return sites.summary().sites[0].backend, tracker.peak.bytes - kept


#: (dtype, head size, causal, with a mask, dropout, needs a gradient): calls whose backend the GPU picks, for
#: predict/emulate/sdpa_choice.py to pick alike (head sizes the fused kernels refuse, masks, dropout, inference).
SDPA_CALLS = [(dtype, d, causal, mask, dropout, grad)
              for dtype in ("float32", "float16", "bfloat16") for d in (32, 64, 72, 128, 256, 512)
              for causal, mask, dropout in ((True, False, 0.0), (False, True, 0.0), (False, False, 0.1))
              for grad in (True, False)]


def check_sdpa_choice() -> Check:
    """The backend scaled_dot_product_attention picks (torch._fused_sdp_choice, as at::scaled_dot_product_attention
    asks) against the one predict/emulate/sdpa_choice.py chooses for the same call on this GPU, for every call of
    SDPA_CALLS."""
    from membench import private
    from membench.predict.emulate import sdpa_choice

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    settings = sdpa_choice.Settings.of_process()
    rows, differ = [], []
    for dtype_name, d, causal, with_mask, dropout, grad in SDPA_CALLS:
        dtype = getattr(torch, dtype_name)
        q, k, v = (torch.randn(2, 4, 128, d, device="cuda", dtype=dtype, requires_grad=grad) for _ in range(3))
        mask = torch.zeros(2, 1, 128, 128, device="cuda", dtype=dtype) if with_mask else None
        with torch.set_grad_enabled(grad):
            real = private.sdpa_backend(q, k, v, mask, dropout, causal).lower()
            call = sdpa_choice.Call(*(sdpa_choice.Operand.of(t) for t in (q, k, v)),
                                    sdpa_choice.Operand.of(mask) if mask is not None else None, dropout, causal,
                                    False, grad)
        try:
            predicted = sdpa_choice.choose(call, (p.major, p.minor), settings).backend
        except RuntimeError as exc:
            predicted = f"none ({exc})"
        real = {"efficient_attention": "efficient", "flash_attention": "flash", "cudnn_attention": "cudnn"}.get(
            real, real)
        row = {"dtype": dtype_name, "head": d, "causal": causal, "mask": with_mask, "dropout": dropout,
               "grad": grad, "gpu": real, "predicted": predicted}
        rows.append(row)
        if real != predicted:
            differ.append(row)
    return _verdict("SDPA backend choice", not differ, f"{len(rows) - len(differ)} of {len(rows)} calls alike; "
                    f"differ: {differ[:6]}", calls=rows, cudnn=settings.cudnn_version)


def check_reduction_scratch() -> Check:
    """A full sum's staging buffer and semaphores, as predict/emulate/reductions.py sizes them for this GPU."""
    from membench.predict.beside import target_for
    from membench.predict.emulate.reductions import reduction_scratch
    from membench.predict.gpus import GPUS

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    target = target_for("cuda", p, torch.cuda.get_device_name())
    if isinstance(target, str):
        return Check("reduction scratch", "fail", target)
    rows = {}
    ok = True
    for shape in ((4096, 4096), (64, 1 << 20)):
        x = torch.randn(*shape, device="cuda")
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = x.sum()
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - before - _round512(out.untyped_storage().nbytes())
        predicted = sum(_round512(n) for n in reduction_scratch(torch.ops.aten.sum.default, (x,), {}, out,
                                                                 GPUS[target.gpu]))
        rows["x".join(map(str, shape))] = {"measured_bytes": measured, "predicted_bytes": predicted}
        ok = ok and measured == predicted
    return _verdict("reduction scratch", ok, f"sum of fp32 tensors: {rows}", **rows)


def check_foreach_norm_scratch() -> Check:
    """Gradient clipping's _foreach_norm: what it takes from the allocator and frees before it returns (the peak
    over what stays: its 0-dim norms), against predict/emulate/foreach_norm.py."""
    from membench.predict.emulate.foreach_norm import foreach_norm_scratch

    rows = {}
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        # 200 x 11 partial norms of 4 bytes: 8,800 B, more than the 512 B any small allocation rounds to
        tensors = [torch.randn(n, device="cuda", dtype=dtype) for n in (10 * 65536 + 1, *[100] * 199)]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        norms = torch._foreach_norm(tensors, 2)
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
        predicted = _round512(foreach_norm_scratch(torch.ops.aten._foreach_norm.Scalar, (tensors, 2), {}))
        rows[str(dtype).removeprefix("torch.")] = {"measured_bytes": measured, "predicted_bytes": predicted}
        ok = ok and measured == predicted
        del norms
    return _verdict("_foreach_norm scratch", ok, f"200 tensors, the longest 11 chunks of 65,536: {rows}", **rows)


def check_cudnn_workspace() -> Check:
    """What a cuDNN convolution takes from the caching allocator beyond its outputs, forward and backward: recorded
    for the docs (a prediction does not model it: cuDNN picks its algorithm and workspace on the GPU at run time)."""
    figures = {"cudnn_benchmark": torch.backends.cudnn.benchmark}
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, device="cuda")
    x = torch.randn(32, 64, 56, 56, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = conv(x)
    torch.cuda.synchronize()
    figures["forward_peak_over_kept_bytes"] = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    grad = torch.randn_like(out)  # a dense gradient: sum()'s expanded one would be made contiguous in backward
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out.backward(grad)
    torch.cuda.synchronize()
    figures["backward_peak_over_kept_bytes"] = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    return Check("cuDNN convolution workspace", "recorded", f"3x3 conv, 64 channels, [32, 64, 56, 56] fp32: {figures} "
                 "(not modelled by a prediction)", figures)


CONTEXT_PROBE = """
import json, torch
def outside():  # what the process holds on the GPU beyond the caching allocator's segments
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()
torch.zeros(1, device="cuda")
figures = {"after_init_bytes": outside()}
x = torch.randn(256, 256, device="cuda", requires_grad=True)
(x @ x).sum().backward()
figures["after_matmul_bytes"] = outside()
q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
figures["after_attention_bytes"] = outside()
c = torch.nn.Conv2d(8, 8, 3, device="cuda")
c(torch.randn(2, 8, 16, 16, device="cuda")).sum().backward()
figures["after_convolution_bytes"] = outside()
print(json.dumps(figures))
"""


def check_cuda_context() -> Check:
    """What a fresh process holds on the GPU outside the caching allocator (the CUDA context and the kernels it
    loads lazily), after CUDA starts and after a matmul, an SDPA and a convolution ran forward and backward:
    recorded beside the context membench's whole-device estimate assumes (predict/device.py). Device-wide free
    memory is read, so nothing else may run on the GPU meanwhile: the checks before the membench runs."""
    from membench.predict.device import CUDA_CONTEXT_BYTES

    done = subprocess.run([sys.executable, "-c", CONTEXT_PROBE], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return Check("CUDA context", "error", done.stderr[-600:])
    figures = {**json.loads(done.stdout.strip().splitlines()[-1]), "assumed_bytes": CUDA_CONTEXT_BYTES}
    return Check("CUDA context", "recorded", f"outside the caching allocator: {figures} (membench's whole-device "
                 f"figure assumes {CUDA_CONTEXT_BYTES:,} B)", figures)


def check_default_target() -> Check:
    """`membench predict` without --gpu predicts for this machine's GPU (issue: the local GPU is the default)."""
    from membench.predict import beside

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    target = beside.target_for("cuda", p, torch.cuda.get_device_name())
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-m", "membench", "predict", "--workload", "gpt-tiny", "--techniques",
                               "baseline", "--out", out], capture_output=True, text=True, timeout=240, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    expected = f"PREDICTED (no timing) for {getattr(target, 'gpu', '?')} "
    line = next((x for x in done.stdout.splitlines() if x.startswith("PREDICTED (no timing) for")), done.stdout[-300:])
    return _verdict("the default --gpu", done.returncode == 0 and line.startswith(expected),
                    f"exit {done.returncode}: {line.strip()[:200]} (expected it to start {expected.strip()!r})")


def check_in_process_run() -> Check:
    """A notebook's run: CUDA already started in this process, a model function, no fork."""
    import warnings

    from membench import api

    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = api.run_sweep(lambda: torch.nn.Linear(64, 10), "accum", batch_size=4, device="cuda", out=out,
                              make_batch=_batch, steps=2, accum_steps=2, progress=False)
    statuses = dict(zip(frame["run"], frame["status"], strict=True))
    return _verdict("in-process run", set(statuses.values()) == {"ok"}, f"statuses {statuses}", statuses=statuses)


def _batch(n, generator):
    return torch.randn(n, 64, generator=generator), torch.randint(10, (n,), generator=generator)


# --- membench runs, each in its own process ------------------------------------------------------------------------
def _membench_run(out: Path, args: list[str], env: dict | None = None, timeout: int = 240) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "membench", "run", "--device", "cuda", "--out", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return done.returncode, (done.stdout + done.stderr)[-2000:]


def _records(out: Path) -> dict:
    from membench.results import read_result

    return {p.stem: read_result(p) for p in sorted(out.glob("*.json")) if "." not in p.stem}


def runs_check(name: str, args: list[str], expect: Callable[[dict, int], tuple[bool, str]],
               env: dict | None = None) -> Callable[[Path], Check]:
    def run(work: Path) -> Check:
        out = work / name.replace(" ", "-").replace(":", "")
        code, tail = _membench_run(out, args, env)
        records = _records(out)
        ok, detail = expect(records, code)
        figures = {r: _summary(rec) for r, rec in records.items()}
        return Check(name, "pass" if ok else "fail", detail if ok else f"{detail}; output: {tail[-600:]}", figures)

    run.__name__ = name
    return run


def _summary(record) -> dict:
    m, p = record.memory, record.prediction
    return {"status": record.status, "peak_allocated_bytes": m.peak_allocated_bytes if m else None,
            "peak_reserved_bytes": m.peak_reserved_bytes if m else None,
            "prediction": dataclasses.asdict(p) if p is not None else None,
            "timeline_source": record.timeline.source if record.timeline else None, "error": record.error}


def _all_ok(records: dict, code: int) -> tuple[bool, str]:
    statuses = {n: r.status for n, r in records.items()}
    return code == 0 and bool(statuses) and set(statuses.values()) == {"ok"}, f"exit {code}, statuses {statuses}"


def _predicted_within(records: dict, code: int) -> tuple[bool, str]:
    ok, detail = _all_ok(records, code)
    checks = {n: r.prediction for n, r in records.items()}
    within = {n: (c.within if c else None) for n, c in checks.items()}
    errors = {n: (f"{c.allocated_error:+.3%} / {c.reserved_error:+.3%}" if c and c.allocated_error is not None
                  and c.reserved_error is not None else None) for n, c in checks.items()}
    return ok and all(within.values()), f"{detail}; within the tolerance {within}; errors (allocated / reserved) " \
                                         f"{errors}"


def _oom(records: dict, code: int) -> tuple[bool, str]:
    statuses = {n: r.status for n, r in records.items()}
    return statuses.get("baseline") == "oom", f"exit {code}, statuses {statuses} (expected the baseline oom)"


def run_checks(quick: bool) -> list[Callable[[Path], Check]]:
    small = ["--batch-size", "8", "--steps", "2", "--warmup", "1"]
    checks = [
        runs_check("smoke sweep", ["--workload", "vit-tiny", "--techniques", "accum,ckpt", *small], _all_ok),
        runs_check("predicted vs measured: gpt-tiny", ["--workload", "gpt-tiny", "--techniques", "ckpt",
                                                        "--clip-grad-norm", "1.0", "--no-check", *small],
                   _predicted_within),
        runs_check("cudaMallocAsync", ["--workload", "gpt-tiny", "--techniques", "baseline", "--no-check", *small],
                   _all_ok, env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
        runs_check("large_segment_size_mb:64", ["--workload", "gpt-tiny", "--techniques", "baseline", "--no-check",
                                                *small], _predicted_within,
                   env={"PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:64"}),
        runs_check("amp-fp16+opt-offload with clipping", ["--workload", "gpt-tiny", "--techniques",
                                                          "amp-fp16+opt-offload", "--clip-grad-norm", "1.0", *small],
                   _all_ok),
        runs_check("a budget that must OOM", ["--workload", "gpt-small", "--techniques", "baseline", "--no-check",
                                              "--memory-budget", "64MiB", *small], _oom),
    ]
    if not quick:  # the longest first, so that --jobs keeps every worker busy to the end
        checks.insert(2, runs_check("predicted vs measured: vit-small", ["--workload", "vit-small", "--techniques",
                                                                         "accum", "--no-check", *small],
                                    _predicted_within))
        checks = [lambda work: check_gpu_tests(), *attention_model_checks(small), *checks,
                  lambda work: check_default_target()]
    return checks


# transformers' Llama at a tenth of 7B's width and depth, with 4 key/value heads for 16 query heads (SDPA's
# grouped-query path): no download, a config override (membench/workloads/hf.py).
LLAMA_SMALL = ("hf:llama,hidden_size=1024,num_hidden_layers=8,num_attention_heads=16,num_key_value_heads=4,"
               "intermediate_size=2816,vocab_size=32000")


def attention_model_checks(small: list[str]) -> list[Callable[[Path], Check]]:
    """Models whose attention is scaled_dot_product_attention, trained with torch's optimizers: each run's
    prediction beside it (the backend this GPU picks, its scratch, cuBLAS's operand copies, host tensors)."""
    return [
        runs_check("predicted vs measured: gpt-small SDPA", ["--workload", "gpt-small", "--techniques",
                                                              "amp-bf16,ckpt,amp-bf16+ckpt", "--no-check", *small],
                   _predicted_within),
        runs_check("predicted vs measured: vit_b_16 MultiheadAttention",
                   ["--workload", "vit_b_16", "--batch-size", "16", "--techniques", "amp-bf16,amp-fp16,opt-in-bwd",
                    "--no-check", *small[2:]], _predicted_within),
        runs_check("predicted vs measured: vit_l_16 batch 1 (the tutorial)",
                   ["--workload", "vit_l_16", "--batch-size", "1", "--techniques", "opt-in-bwd", "--no-check",
                    *small[2:]], _predicted_within),
        runs_check("predicted vs measured: hf:gpt2", ["--workload", "hf:gpt2", "--batch-size", "4", "--seq-len",
                                                       "512", "--techniques", "amp-bf16,ckpt", "--no-check",
                                                       *small[2:]], _predicted_within),
        runs_check("predicted vs measured: hf:bert fp16 dropout", ["--workload", "hf:bert", "--batch-size", "8",
                                                                    "--seq-len", "512", "--techniques", "amp-fp16",
                                                                    "--no-check", *small[2:]], _predicted_within),
        runs_check("predicted vs measured: Adam variants", ["--workload", "vit-small", "--optimizer", "adam",
                                                             "--techniques", "fused-adam,foreach-off,opt-in-bwd",
                                                             "--no-check", *small],
                   _predicted_within),
        runs_check("predicted vs measured: Llama shape with grouped-query attention",
                   ["--workload", LLAMA_SMALL, "--batch-size", "4", "--seq-len", "1024", "--techniques",
                    "amp-bf16,amp-bf16+ckpt", "--no-check", *small[2:]], _predicted_within),
        # A distributed run is predicted per rank (`predict --world-size`), never beside its ranks' measurements:
        # the check is that they run; benchmarks/validate_gpu_runs.py predicts them from the kept records.
        runs_check("fsdp at world size 1", ["--workload", "gpt-small", "--techniques", "fsdp,fsdp+amp-bf16",
                                            "--nproc-per-node", "1", "--no-check", *small], _all_ok),
    ]


def check_gpu_tests() -> Check:
    """The `gpu`-marked tests (tests/trackers/test_cuda.py and others), as pytest reports them."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-n", "4", "-p", "no:cacheprovider",
                           "tests"],
                          capture_output=True, text=True, timeout=420, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    last = (done.stdout.strip().splitlines() or [""])[-1]
    return _verdict("-m gpu tests", done.returncode == 0, last, tail=done.stdout[-12000:])


# --- the run --------------------------------------------------------------------------------------------------
def _timed(check: Callable[[], Check], name: str) -> Check:
    started = time.perf_counter()
    try:
        result = check()
    except Exception as exc:  # noqa: BLE001 - one check's failure is its own row, never the run's end
        result = Check(name, "error", f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()[-3000:]})
    result.seconds = round(time.perf_counter() - started, 1)
    print(f"gpu_acceptance: {result.name}: {result.status}: {result.detail[:300]}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-acceptance")
    parser.add_argument("--quick", action="store_true",
                        help="leave out the vit-small runs, the attention models' runs and the -m gpu tests")
    parser.add_argument("--jobs", type=int, default=1, help="membench-run checks at a time (default 1)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the membench runs' results folders here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be 1 or more")
    if not torch.cuda.is_available():
        print(f"gpu_acceptance: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False): "
              f"nothing checked, nothing written; run it on a CUDA machine (exit {NO_GPU_EXIT})")
        return NO_GPU_EXIT
    started = time.perf_counter()
    facts = [(check_cuda_context, "CUDA context"),
             (check_versions, "versions and the GPU table"), (check_cublas_workspace, "cuBLAS workspace"),
             (check_adam_step_device, "Adam's step device"), (check_sdpa, "SDPA backend and backward scratch"),
             (check_sdpa_choice, "SDPA backend choice"),
             (check_reduction_scratch, "reduction scratch"), (check_foreach_norm_scratch, "_foreach_norm scratch"),
             (check_cudnn_workspace, "cuDNN convolution workspace"), (check_in_process_run, "in-process run")]
    results: list[Check] = []
    lock = threading.Lock()

    def record(result: Check) -> None:  # the file is rewritten after each check: a run cut short keeps what it did
        with lock:
            results.append(result)
            _write(args.out, results, time.perf_counter() - started, finished=False)

    for f, n in facts:
        record(_timed(f, n))
    with tempfile.TemporaryDirectory() as temporary, ThreadPoolExecutor(args.jobs) as pool:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        list(pool.map(lambda check: record(_timed(lambda: check(work), getattr(check, "__name__", "check"))),
                      run_checks(args.quick)))
    return _write(args.out, results, time.perf_counter() - started)


@functools.cache
def _environment():
    from membench import environment

    return environment.describe("cuda")


def _write(out: Path, results: list[Check], seconds: float, finished: bool = True) -> int:
    from membench.common.typedjson import to_plain

    env = _environment()
    name = f"{(env.device_name or 'gpu').replace(' ', '-')}_torch{torch.__version__.split('+')[0]}.json"
    out.mkdir(parents=True, exist_ok=True)
    failed = [r.name for r in results if r.status in ("fail", "error")]
    (out / f"{name}.part").write_text(json.dumps({"environment": to_plain(env), "seconds": round(seconds, 1),
                                        "finished": finished, "failed": failed,
                                        "checks": [dataclasses.asdict(r) for r in results]}, indent=1, default=str))
    (out / f"{name}.part").replace(out / name)  # whole or not at all, if the run is cut short while writing
    if not finished:
        return 1
    print(f"gpu_acceptance: {len(results) - len(failed)} of {len(results)} checks passed or recorded in "
          f"{seconds:.0f} s; {'failed: ' + ', '.join(failed) if failed else 'none failed'}; wrote {out / name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
