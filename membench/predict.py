"""Predict the peak memory a training step would allocate on a CUDA GPU, on a machine with no GPU.

The model is built on `meta`, materialized as fake tensors on cpu, and the real training step (membench.step,
with the technique stack) runs under the exact storage tracker with sizes rounded up to the CUDA caching
allocator's 512-byte blocks. Fake tensors hold no data, so this takes seconds even for vit_l_16 and needs no
memory. A prediction is a different kind of number from a measurement: its result file says `"predicted": true`
and lists what it cannot see; `membench check` refuses to compare the two kinds unless told to.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from membench import environment
from membench.errors import UserError
from membench.results import SCHEMA_VERSION, result_path, write_json
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import REGISTRY, Technique, check_stack
from membench.trackers import fake
from membench.trackers.memory import CpuMeter
from membench.workloads import load_workload

CUDA_BLOCK = 512  # the caching allocator rounds every allocation up to a multiple of this

CANNOT_SEE = (
    "CUDA context and loaded kernels (in driver_used, not in allocated)",
    "library workspaces outside the caching allocator (cuDNN, NCCL; cuBLAS on old torch)",
    "fragmentation and cached blocks: reserved memory is not simulated",
    "kernel choice: CUDA kernels may save other tensors than the CPU ones (flash vs math attention, cuDNN)",
    "ops whose output size depends on data, and model code that branches on tensor values",
)


class _Prepared(Technique):
    """First in the stack: hands build_state the fake model, and makes the optimizer's default the one CUDA
    picks (foreach, whose intermediates the CPU default skips)."""

    name = "predict"
    summary = "prediction plumbing"
    order = 0

    def __init__(self, spec: RunSpec, model, cuda: bool):
        super().__init__(spec)
        self.model, self.cuda = model, cuda

    def build_model(self, build, device):
        return self.model

    def configure(self, state) -> None:
        if self.cuda:
            state.optimizer_options.setdefault("foreach", True)


class _WithRealRanks(Technique):
    """A distributed technique sets up its device mesh with real tensors (rank arithmetic); its model stays fake."""

    def __init__(self, inner: Technique):
        super().__init__(inner.spec)
        self.inner = inner

    def configure(self, state) -> None:
        with fake.real_tensors():
            self.inner.configure(state)


def world_size(spec: RunSpec) -> int | None:
    """The world size a fake process group must play, or None for a single-process run."""
    if spec.nproc_per_node > 1 or any(REGISTRY[t].distributed for t in spec.techniques):
        return spec.nproc_per_node
    return None


def predict_memory(spec: RunSpec, round_to: int | None = None) -> dict:
    """The memory result of one spec, as a measurement of spec.device would report it (peak, phase, breakdown).

    spec.device is the target: "cuda" rounds to 512-byte blocks and uses CUDA's optimizer defaults; "cpu" predicts
    what the exact CPU tracker measures (round_to=1), which is how the predictor is tested against real runs.
    """
    cuda = spec.device == "cuda"
    round_to = round_to or (CUDA_BLOCK if cuda else 1)
    check_stack(spec.techniques, spec.device)
    run = dataclasses.replace(spec, device="cpu")  # fake tensors live on cpu: fake cuda fails in backward
    workload = load_workload(spec.workload)
    techniques = sorted((REGISTRY[n](run) for n in spec.techniques), key=lambda t: t.order)
    for t in techniques:
        t.validate(run, workload)
    ranks = world_size(spec)
    if ranks:
        import torch.distributed.fsdp  # noqa: F401 - imported before the tracker starts, so it sees FSDP's frees

    # A technique may build its own way (another dtype): let it, but on meta, so nothing is allocated yet.
    meta_build = lambda: fake.build_on_meta(workload.build_model)  # noqa: E731
    meta_model = next((m for t in techniques if (m := t.build_model(meta_build, "meta")) is not None), None)
    meta_model = meta_model or meta_build()
    meter = CpuMeter(round_to=round_to)
    data = batches(workload, run)
    warmup = min(spec.warmup, 1)  # after one step the optimizer state exists: the steady state
    group = fake.fake_process_group(ranks) if ranks else _nothing()
    with group, fake.fake_tensors(), meter.active():
        prepared = _Prepared(run, fake.materialize(meta_model), cuda)
        stack = [prepared] + [_WithRealRanks(t) if t.distributed else t for t in techniques]
        state = build_state(run, workload, stack, on_model=meter.attach_model)
        meter.attach_optimizers(state.optimizers)
        for i in range(warmup + 1):
            if i == warmup:
                meter.reset_peak()
            meter.start_step(i)
            train_step(state, next(data), meter.phase)
        memory = meter.result()
    del state, data
    memory.update(device=spec.device, method=f"prediction: fake tensors, storage tracker, {round_to}-byte blocks",
                  world_size=ranks or 1)
    return memory


def predict(spec: RunSpec, round_to: int | None = None) -> dict:
    """A result record like a worker's, marked as a prediction. Failures become a status, as with real runs."""
    started = time.time()
    record = {"schema_version": SCHEMA_VERSION, "name": spec.name, "spec": spec.to_dict(),
              "env": environment.describe("cpu"), "started": started, "predicted": True,
              "predicted_for": spec.device, "cannot_see": list(CANNOT_SEE), "timing": None}
    try:
        record["memory"] = predict_memory(spec, round_to)
        record["status"] = "ok"
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model fake tensors cannot run is this run's status, not a crash
        record.update(status="error", memory=None,
                      error=f"cannot predict: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    record["wall_s"] = time.time() - started
    return record


def predict_all(specs: list[RunSpec], out_dir: Path | None, on_done=None) -> list[dict]:
    results = []
    for spec in specs:
        record = predict(spec)
        if out_dir is not None:
            write_json(result_path(out_dir, spec.name), record)
        if on_done:
            on_done(spec, record)
        results.append(record)
    return results


def default_predict_dir(spec: RunSpec, root: Path = Path("results")) -> Path:
    """Predictions live in their own tree, never beside measurements."""
    key = environment.machine_key(environment.describe("cpu"))
    return root / "predicted" / key / f"{spec.device}-{spec.workload.replace(':', '.')}-bs{spec.batch_size}"


def _nothing():
    import contextlib

    return contextlib.nullcontext()
