"""Predict the peak memory a training step would allocate on a CUDA GPU, on a machine with no GPU.

The model is built on `meta`, materialized as fake tensors on cpu, and the real training step (membench.step,
with the technique stack) runs under the exact storage tracker with sizes rounded up to the CUDA caching
allocator's 512-byte blocks. Fake tensors hold no data, so this takes seconds even for vit_l_16 and needs no
memory. A prediction is a different kind of number from a measurement: its result file says `"predicted": true`
and lists what it cannot see; `membench check` refuses to compare the two kinds unless told to.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import os
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from membench import environment, optimizers, private
from membench.allocator.account import with_reset
from membench.allocator.events import TraceEvent
from membench.common.errors import UserError
from membench.measure import Session
from membench.predict import compiled, device, fragmentation, gpus, peak_source, steady, streams
from membench.predict.emulate import fake, versions
from membench.predict.emulate.kernels import CudaKernels, cuda_gpu
from membench.predict.emulate.lowbit_optimizers import LowBitStandIn
from membench.predict.emulate.lowbit_optimizers import note as lowbit_note
from membench.predict.emulate.off_device import OffDeviceLedger
from membench.predict.emulate.sdpa import CudaSdpa
from membench.predict.ranks import predict_ranks
from membench.predict.time import SPEEDS, OpRecorder, predict_time
from membench.results import Compiled, Memory, RunRecord, result_path, write_record
from membench.spec import Job, RunSpec
from membench.step import batches
from membench.techniques import Stack, Technique, cost_of, resolve, torch_older_than
from membench.trackers.memory import CpuMeter
from membench.workloads import Workload, load_workload

if TYPE_CHECKING:
    from membench.allocator import ReservedSummary
    from membench.trackers.storage import StorageTracker

CUDA_BLOCK = 512  # the caching allocator rounds every allocation up to a multiple of this

# One short line each; the evidence and the numbers behind them: docs/predict.md, "What a prediction cannot see".
CANNOT_SEE = (
    "CUDA context and loaded kernels (in driver_used, not in allocated)",
    "library workspaces outside the caching allocator (cuDNN, NCCL)",
    "scratch of kernels not modelled: other reductions (max/min, norms, var/std), cuDNN convolutions' workspaces",
    "reserved memory is simulated: a GPU's allocation order and its driver's segment addresses can differ; CUDA "
    "graphs and cudaMallocAsync are not modelled",
    "kernel choice: what cuDNN convolutions save, cuDNN attention's engine workspace, nn.MultiheadAttention's "
    "inference fast path",
    "ops whose output size depends on data, and model code that branches on tensor values",
)


class _Prepared(Technique):
    """First in the stack: hands build_state the fake model, and makes the optimizer's default the one CUDA
    picks (foreach, whose intermediates the CPU default skips) for the optimizers that default to it there (Adam,
    AdamW, SGD; not Adafactor, and a user's factory keeps whatever it chooses)."""

    name = "predict"
    summary = "prediction plumbing"
    order = 0

    def __init__(self, spec: RunSpec, model, cuda: bool, ledger: OffDeviceLedger | None = None):
        super().__init__(spec)
        self.model, self.cuda, self.ledger = model, cuda, ledger

    def build_model(self, build, device):
        return self.model

    def configure(self, state) -> None:
        if self.cuda and optimizers.cuda_defaults_to_foreach(self.spec.optimizer):
            state.optimizer_options.setdefault("foreach", True)
        state.optimizer_stand_in = self._stand_in  # predict/emulate/lowbit_optimizers.py
        state.host_memory = self.ledger  # predict/emulate/off_device.py

    def _stand_in(self, name: str, params, lr: float, options: dict):
        """bitsandbytes' and torchao's optimizers, whose steps fake tensors cannot run: their state made as theirs."""
        if name not in optimizers.LIBRARY:
            return None
        optimizers.check(name)  # installed, as a run needs it
        optimizers.refuse_options(name, options)
        return LowBitStandIn(params, lr, name, self.cuda, self.ledger.paged if self.ledger else None)


class _WithRealRanks(Technique):
    """A distributed technique sets up its device mesh with real tensors (rank arithmetic); its model stays fake."""

    def __init__(self, inner: Technique):
        super().__init__(inner.spec)
        self.inner = inner
        self.order = inner.order

    def configure(self, state) -> None:
        with fake.real_tensors():
            self.inner.configure(state)


def world_size(spec: RunSpec, stack: Stack) -> int | None:
    """The world size a fake process group must play, or None for a single-process run."""
    if spec.nproc_per_node > 1 or stack.distributed:
        return spec.nproc_per_node
    return None


@dataclasses.dataclass
class Traced:
    """A prediction with the allocations behind it: every allocation (its raw bytes) and free from the model's
    construction on, in order; the measured step's begin at events[measured_from]."""

    memory: Memory
    events: list[TraceEvent]
    measured_from: int
    round_to: int
    kernel_calls: list = dataclasses.field(default_factory=list)  # calls that may take kernel scratch (fit)
    assumed: list[str] = dataclasses.field(default_factory=list)  # what was answered without being known
    compiled: Compiled | None = None  # the compile technique: the partitioner's saved tensors (predict/compiled.py)
    ops: list = dataclasses.field(default_factory=list)  # a CUDA prediction's measured step, op by op (predict/time)
    time: object = None  # its predicted step time (results.schema.PredictedTime)


def predict_memory(job: Job, round_to: int | None = None, rank: int = 0, cache: ModelCache | None = None) -> Memory:
    """The memory of one run as a measurement on job.run.device would report it (peak, phase, breakdown).

    The device is the target: "cuda" rounds to 512-byte blocks and uses CUDA's optimizer defaults; "cpu" predicts
    what the exact CPU tracker measures (round_to=1), which is how the predictor is tested against real runs.
    Measured by the same Session as a real run, on fake tensors.
    """
    return predict_traced(job, round_to, trace=job.run.device == "cuda", rank=rank, cache=cache).memory


def predict_traced(job: Job, round_to: int | None = None, trace: bool = True, derive_warmup: bool = True,
                   rank: int = 0, cache: ModelCache | None = None) -> Traced:
    """predict_memory, keeping the allocation trace (fit derives other batch sizes from a few of them).

    derive_warmup: write the warm-up step's allocations from the measured step's instead of running it, where
    membench.predict.steady can (half the time; checked, and run after all where a check fails).
    rank: the rank of a distributed run the process plays (predict/ranks.py: each rank whose shards differ).
    cache: the workloads and meta models of the command's earlier configurations (None: built afresh)."""
    traced = _predict_once(job, round_to, trace, derive_warmup, rank, cache)
    if traced is None:  # a check refused the written warm-up step: run it instead
        traced = _predict_once(job, round_to, trace, False, rank, cache)
    return traced


def _predict_once(job: Job, round_to: int | None, trace: bool, derive_warmup: bool, rank: int,
                  cache: ModelCache | None) -> Traced | None:
    """predict_traced, or None where the warm-up step was to be written and a check refused to write it."""
    spec = job.run
    cuda = spec.device == "cuda"
    round_to = round_to or (CUDA_BLOCK if cuda else 1)
    run = dataclasses.replace(spec, device="cpu", memory_budget=None)  # fake tensors live on cpu
    stack, workload = _what_runs(run, spec.device, cache)
    ranks = world_size(spec, stack)
    meta_model = _model_on_meta(run, stack, workload, ranks, cache)
    warmup = min(job.measure.warmup, 1)  # after one step the optimizer state exists: the steady state
    gpu = gpus.predicted_for(spec) if cuda else None
    # A separate cuBLASLt workspace (torch before 2.13) comes with a thread's first biased addmm, which priming
    # cannot know of before the step: the warm-up step is run.
    primes = derive_warmup and _derivable(spec, stack, warmup, ranks) and not stack.compiles and not (
        gpu is not None and gpus.cublaslt_workspace_bytes(versions.release()))
    tags = streams.StreamTags() if ranks and gpu is not None else None  # FSDP2's streams: the allocator's pools
    on_streams = None
    compiled_note = compiled.note(meta_model)
    eager = private.dynamo_eager() if compiled_note else contextlib.nullcontext()
    with eager, _fake_world(ranks, gpu, rank) as (values, kernels):
        session = _fake_session(run, stack, workload, meta_model, kernels, round_to,
                                trace=trace or cuda or derive_warmup, tags=tags)
        with _no_collector_within_steps():
            session.build()
            primed = steady.prime(session) if primes else None
            _warm_up(session, primed, warmup)
            traced = _measured_step(session, primed, round_to)
            if tags is not None:
                on_streams = tags.names(session.state.model), session.meter.tracker.bytes_by_stream()
            partitioned = [t for t in session.stack.techniques if isinstance(t, compiled.Partitioned)]
        session.detach()
    if traced is None:
        return None
    _label(traced, spec, stack, on_streams)
    if workload.causal_lm is not None:  # a causal LM's peak: how much of it is the loss's fp32 logits
        micro = spec.batch_size // (spec.accum_steps if "accum" in spec.techniques else 1)
        traced.memory.peak_source = peak_source.logits_note(
            traced.events, traced.measured_from, traced.round_to, traced.memory.peak_allocated_bytes,
            micro * workload.items_per_sample, peak_source.output_vocabulary(meta_model))
    if session.meter.tracker.off_device is not None:
        traced.memory.off_device = session.meter.tracker.off_device.result()
    traced.assumed = [*values.answered(), *filter(None, [compiled_note, lowbit_note(spec.optimizer, cuda)])]
    if partitioned:
        traced.compiled = compiled.compiled_record(spec, partitioned[0].saved)
        traced.assumed.append(compiled.APPROXIMATED)
    if kernels is not None:
        traced.memory.attention = kernels.find(CudaSdpa).sites.summary()
    # Single-GPU runs of a card with speed figures (predict/time/hardware.py); collectives are not timed yet.
    if gpu is not None and traced.ops and not ranks and gpu.name in SPEEDS:
        traced.time = predict_time(traced.ops, gpu.name, gpu.sm_count, gpu.compute_capability, spec.batch_size,
                                   workload.items_per_sample, workload.unit)
    return traced


def _what_runs(run: RunSpec, target: str, cache: ModelCache | None) -> tuple[Stack, Workload]:
    """The stack and workload, refused where a prediction on CPU cannot stand for them."""
    stack = resolve(run, target_device=target)
    check_predictable(stack)
    workload = cache.workload(run) if cache is not None else load_workload(run.workload, run.seq_len)
    stack.validate(run, workload)
    return stack, workload


def check_predictable(stack: Stack) -> None:
    """CannotPredict where a prediction on CPU cannot stand for this stack, here."""
    if not stack.predictable:
        moved = ", ".join(t.name for t in stack.techniques if not t.predictable)
        raise CannotPredict(f"{moved} moves tensors between host and device memory, which a prediction on CPU "
                            "cannot tell apart: measure it on a GPU")
    for t in stack.techniques:
        installed = torch_older_than(t.min_torch_predicted)
        if installed:
            raise CannotPredict(f"predicting {t.name} needs torch >= {t.min_torch_predicted} "
                                f"({t.min_torch_predicted_for}); this is torch {installed}: measure it with "
                                "membench run, which trains it there")


def _model_on_meta(run: RunSpec, stack: Stack, workload: Workload, ranks: int | None, cache: ModelCache | None):
    """The model on meta, nothing allocated yet; a technique may build it its own way (another dtype)."""
    if ranks:
        import torch.distributed.fsdp  # noqa: F401 - imported before the tracker starts, so it sees FSDP's frees
    meta_build = lambda: fake.build_on_meta(workload.build_model)  # noqa: E731
    meta_model = next((m for t in stack.techniques if (m := t.build_model(meta_build, "meta")) is not None), None)
    if meta_model is not None:
        return meta_model
    return cache.model(run, meta_build) if cache is not None else meta_build()


@contextlib.contextmanager
def _fake_world(ranks: int | None, gpu: gpus.Gpu | None, rank: int = 0):
    """Fake tensors, a fake process group of `ranks` (this process playing `rank`), and for a CUDA GPU the device as
    the registered emulations make it (yielded: their CudaKernels, else None)."""
    group = fake.fake_process_group(ranks, rank) if ranks else contextlib.nullcontext()
    device = cuda_gpu(gpu) if gpu is not None else contextlib.nullcontext()
    # The fake CPU tensors stand for CUDA ones, which capturable optimizers and clip_grad_norm_'s foreach path take.
    cuda_tensors = _cuda_tensors() if gpu is not None else contextlib.nullcontext()
    with group, fake.fake_tensors() as values, device as kernels, cuda_tensors, private.fake_module_moves():
        yield values, kernels


@contextlib.contextmanager
def _cuda_tensors():
    with private.capturable_on_cpu(), private.foreach_takes_fake_tensors():
        yield


def _fake_session(run: RunSpec, stack: Stack, workload: Workload, meta_model, kernels: CudaKernels | None,
                  round_to: int, trace: bool, tags: streams.StreamTags | None) -> Session:
    """The same Session a run measures with, on the fake model, under the exact tracker in round_to-byte blocks;
    for a CUDA GPU (`kernels`) with what its kernels allocate besides their outputs (cuBLAS's workspaces, scratch)."""
    meter = CpuMeter(round_to=round_to, trace=trace, compiled=stack.compiles)
    if kernels is not None:
        meter.tracker.kernels = kernels
        meter.tracker.off_device = OffDeviceLedger(meter.tracker)
    prepared = _Prepared(run, fake.materialize(meta_model), cuda=kernels is not None, ledger=meter.tracker.off_device)
    techniques = (prepared, *(_WithRealRanks(t) if t.distributed else compiled.Partitioned(t) if t.compiles else t
                              for t in stack.techniques))
    if tags is not None:
        meter.tracker.stream_of = tags.current
    data = _collected_between(batches(workload, run))
    return Session(run, dataclasses.replace(stack, techniques=techniques), workload, meter,
                   _made_on_host(data, meter.tracker) if kernels is not None else data, track_host=False)


def _warm_up(session: Session, primed: steady.Primed | None, warmup: int) -> None:
    """The warm-up step: run, or where it was primed only its batch taken (the measured step lets go of it as a
    run's does)."""
    if primed is None:
        session.warm_up(warmup)
    else:
        with session.meter.active():
            session.skip(warmup)


def _measured_step(session: Session, primed: steady.Primed | None, round_to: int) -> Traced | None:
    """The measured step, and the trace from construction on; where the warm-up was primed, with the warm-up
    step's allocations written in (steady.write_warmup), or None where a check refuses to write them."""
    tracker = session.meter.tracker
    measured_from = len(tracker.trace or ())
    start_bytes = tracker.current
    recorder = OpRecorder(tracker) if tracker.kernels is not None else contextlib.nullcontext()
    with steady.watching(session) if primed is not None else contextlib.nullcontext() as seen, recorder:
        memory, _, _ = session.measure(1)
    ops = recorder.calls if tracker.kernels is not None else []
    # A copy: the tracker's list goes on growing with frees while what the step left is collected later (in
    # another prediction, even), and fit compares traces event for event.
    trace = list(tracker.trace or ())
    calls = list(tracker.kernel_calls or ())
    if primed is None:
        return Traced(memory, trace, measured_from, round_to, calls, ops=ops)
    gc.collect()  # what the step left for the collector: a run's next step frees it as it begins
    garbage = [e.key for e in tracker.trace[len(trace):] if e.kind == "free"]
    step = steady.MeasuredStep(trace, measured_from, garbage, memory.peak_allocated_bytes, start_bytes, round_to,
                               calls)
    try:
        written = steady.write_warmup(primed, seen, step)
    except steady.CannotWrite:
        return None
    return Traced(memory, written.events, written.measured_from, round_to, written.kernel_calls, ops=ops)


def _label(traced: Traced, spec: RunSpec, stack: Stack,
           on_streams: tuple[dict[int, tuple[str, str]], dict[int, dict[str, int]]] | None) -> None:
    """What the prediction is of and how it was made; for a CUDA GPU, its reserved memory too, and where FSDP2 ran
    on several streams (`on_streams`: their names, bytes allocated on each by category), each stream's share."""
    memory = traced.memory
    memory.device = spec.device
    memory.method = f"prediction: fake tensors, storage tracker, {traced.round_to}-byte blocks"
    if spec.device == "cuda":
        # The meter resets the peaks before the measured step: so does the simulator (allocator/account.py).
        events = with_reset(traced.events, traced.measured_from)
        reserved = _add_reserved(memory, events, stack, spec.memory_budget, traced.round_to)
        if spec.memory_budget is None:  # more than the GPU holds, unbounded: replayed under it (predict/device.py)
            memory.on_card = device.on_card(events, allocator_settings(stack), memory.peak_reserved_bytes,
                                            gpus.predicted_for(spec).memory_bytes, device.run_mesh(spec))
        memory.fragmented = fragmentation.for_run(events, allocator_settings(stack), spec, memory)
        if on_streams is not None:
            names, by_stream = on_streams
            memory.streams = streams.stream_uses(names, by_stream, reserved.reserved_by_stream_at_peak)


class ModelCache:
    """The configurations of one command sharing their workload and its meta model: each workload loaded, and its
    model built on meta, once; a configuration that builds the model the default way (no technique builds it
    another way) starts from a deep copy of the one built first, so what it predicts is what a fresh process
    predicts (tests/test_reuse.py compares the records). Passed to predict_traced (predict_all and fit make one)."""

    def __init__(self):
        self.workloads: dict[tuple, Workload] = {}
        self.models: dict[tuple, object] = {}

    def workload(self, spec: RunSpec) -> Workload:
        key = (spec.workload, spec.seq_len)
        if key not in self.workloads:
            self.workloads[key] = load_workload(spec.workload, spec.seq_len)
        return self.workloads[key]

    def model(self, spec: RunSpec, build):
        key = (spec.workload, spec.seq_len)
        if key not in self.models:
            self.models[key] = build()
        return copy.deepcopy(self.models[key])


def _derivable(spec: RunSpec, stack: Stack, warmup: int, ranks: int | None) -> bool:
    """Whether a run's first step differs from its next only by what steady.prime makes: an optimizer step that
    makes its state first, gradients let go between steps, no process group (FSDP sets itself up lazily)."""
    return (warmup == 1 and not ranks and not spec.inference and spec.zero_grad == "none"
            and spec.optimizer in steady.DERIVABLE_OPTIMIZERS and not stack.distributed)


@contextlib.contextmanager
def _no_collector_within_steps():
    """Storages held in reference cycles (checkpointing's recomputation state) are freed when Python's cycle
    collector runs, which it does after a count of Python objects made: fake tensors make many more than real ones,
    and how many depends on what ran before in the process (fake-tensor cache misses), so the frees would move from
    one prediction to the next. Off within a prediction, and run at each step's start (_collected_between), the
    trace is the same for the same run, and the same op for op at every batch size (fit derives from that).
    What lived before is frozen, so that those collections look only at what the prediction made (a full
    collection of torch's objects would take a tenth of a second each time)."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def _collected_between(data):
    """The batches, with the cycle collector run before each step takes its batch."""
    for batch in data:
        gc.collect()
        yield batch
        del batch  # gone before the next is made, as on a GPU (step.batches)


def _made_on_host(data, tracker: StorageTracker):
    """The batches of a CUDA prediction: a GPU run makes each on the host (the workload's make_batch: CPU tensors)
    and copies it to the GPU in the step, so only what the step takes as its inputs is counted, from then on
    (Session.step and skip track them); make_batch's temporaries (gpt's [B, L + 1] tokens) never are."""
    while True:
        tracker.unseen = True
        try:
            batch = next(data)
        finally:
            tracker.unseen = False
        yield batch
        del batch


def _add_reserved(memory: Memory, trace: list[TraceEvent], stack: Stack, budget: int | None,
                  round_to: int = CUDA_BLOCK) -> ReservedSummary:
    """Reserved memory: the step's allocations, in order from the model's construction on (peaks reset where the
    measured step begins), through the caching allocator simulator with the run's allocator settings (the user's
    PYTORCH_CUDA_ALLOC_CONF plus the stack's, e.g. expandable-segments). A budget acts as a memory fraction, as it
    does on a real GPU."""
    from membench.allocator import Tracked, reserved_summary

    # Held against the tracker's count, event by event, where it rounds as the allocator does (account.py).
    tracked = Tracked(memory.peak_allocated_bytes, memory.current_bytes) if round_to == CUDA_BLOCK else None
    r = reserved_summary(trace, allocator_settings(stack), capacity=budget, memory_fraction=1.0 if budget else None,
                         placement=device.SEGMENT_PLACEMENT, tracked=tracked)
    memory.peak_reserved_bytes = r.peak_reserved_bytes
    memory.allocator_peak_allocated_bytes = r.allocator_peak_allocated_bytes
    memory.reserved_at_peak_allocated_bytes = r.reserved_at_peak_allocated_bytes
    memory.fragmentation_at_peak_bytes = r.fragmentation_at_peak_bytes
    memory.segments_allocated = r.segments_allocated
    memory.allocator_settings = r.allocator_settings
    memory.reserved_oom = r.reserved_oom
    memory.reserved_method = r.reserved_method
    return r


def allocator_settings(stack: Stack):
    """The caching allocator's settings a run of this stack gets: the user's PYTORCH_CUDA_ALLOC_CONF plus the
    stack's own (expandable-segments)."""
    from membench.allocator import settings_from_env
    from membench.allocator.settings import with_allocator_env

    return settings_from_env(with_allocator_env(os.environ, stack.env))


class CannotPredict(Exception):
    """A run a prediction cannot stand for: its status is error, with this reason (not a bug: no traceback)."""


def predict(job: Job, round_to: int | None = None, cache: ModelCache | None = None) -> RunRecord:
    """A result record like a worker's, marked as a prediction. Failures become a status, as with real runs;
    a failure that is a membench bug keeps its traceback in the record (and `membench predict` prints it)."""
    started = time.time()
    record = RunRecord(name=job.name, status="ok", spec=job, env=environment.describe("cpu"),
                       started=started, predicted=True, predicted_for=job.run.device, cannot_see=list(CANNOT_SEE))
    try:
        stack = resolve(job.run, target_device=job.run.device)
        record.numerics = stack.numerics  # whether it changes precision, for the report (it has no check)
        record.cost = cost_of(job.run.techniques)  # how the report names the cheapest (results/choice.py)
        traced = predict_traced(job, round_to, trace=job.run.device == "cuda", cache=cache)
        stated = versions.notice() if job.run.device == "cuda" else None  # rules not checked on this torch
        record.memory, record.assumed = traced.memory, [*traced.assumed, *filter(None, [stated])] or None
        record.compiled = traced.compiled
        record.predicted_time = traced.time
        record.world_size = world_size(job.run, stack) or 1
        if record.world_size > 1:  # each rank whose shards differ (uneven shards), rank 0 first
            record.ranks = predict_ranks(job, round_to, record.memory, functools.partial(predict_memory, cache=cache))
    except UserError:
        raise
    except (CannotPredict, fake.NeedsValues) as exc:
        record.status, record.error = "error", f"cannot predict: {exc}"
    except Exception as exc:  # noqa: BLE001 - a model fake tensors cannot run is this run's status, not a crash
        record.status = "error"
        record.error = f"cannot predict: {type(exc).__name__}: {exc}"
        record.traceback = traceback.format_exc()
    record.wall_s = time.time() - started
    return record


def predict_all(jobs: list[Job], out_dir: Path | None, on_done=None, on_start=None,
                cache: ModelCache | None = None) -> list[RunRecord]:
    """Each job predicted in turn in this process, sharing the workload's model (`cache`, else one of their own)."""
    cache = cache if cache is not None else ModelCache()
    results = []
    for job in jobs:
        if on_start:
            on_start(job)
        record = predict(job, cache=cache)
        if out_dir is not None:
            write_record(result_path(out_dir, job.name), record)
        if on_done:
            on_done(job, record)
        results.append(record)
    return results


def refuse_over_measurements(jobs: list, out: Path) -> None:
    """A prediction never replaces a measurement: refused where a run's result file holds a measured result."""
    from membench.results import check_result_paths, read_result, result_path

    check_result_paths(jobs, out)
    for job in jobs:
        path = result_path(out, job.name)
        if path.is_file():
            try:
                measured = not read_result(path).predicted
            except UserError:
                measured = True  # unreadable: not known to be a prediction, so not overwritten
            if measured:
                raise UserError(f"{path} holds a measured result (or one that cannot be read): a prediction never "
                                "replaces a measurement; choose another --out")


def default_predict_dir(spec: RunSpec, root: Path = Path("results")) -> Path:
    """Predictions live in their own tree, never beside measurements."""
    key = environment.machine_key(environment.describe("cpu"))
    folder = f"{spec.device}-{spec.workload.replace(':', '.')}-bs{spec.batch_size}{spec.loop_slug}"
    return root / "predicted" / key / folder
