"""The result record's schema: what a result file holds, typed and versioned.

A result file is one `RunRecord` as JSON. `RunRecord.from_json` is the only reader: it checks every known field's
type (a malformed or hand-edited file is refused with one line naming the file and the field) and upgrades older
schema versions. `RunRecord.to_json` is the only writer. Everything else reads attributes, never dict keys.
Bytes and seconds are stored; units are a display matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from membench.common.errors import UserError
from membench.common.typedjson import build_checked, parse_json, to_plain
from membench.common.vocab import FINISHED, Category, Cost, Numerics, Phase, Status, Verdict
from membench.spec import Device, Job

SCHEMA_VERSION = 2


@dataclass
class Environment:
    """Where a run happened: results are keyed by device model and versions, never mixed across them."""

    device: str
    device_name: str | None = None
    device_count: int | None = None
    driver_version: str | None = None
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    host: str | None = None
    platform: str | None = None
    cpu_threads: int | None = None
    git_commit: str | None = None


@dataclass
class ModuleBytes:
    """Bytes of one category held at the peak by one module (its qualified name, e.g. blocks.3.mlp): what it
    allocated while running (forward or its backward) or owns (its parameters, their gradients and Adam state)."""

    module: str
    category: Category
    bytes: int


@dataclass
class SiteBytes:
    """CUDA: bytes live at the peak of the allocator's trace, by the Python line that allocated them."""

    site: str  # file:line (function)
    bytes: int
    blocks: int


@dataclass
class AttentionSite:
    """A CUDA prediction: one kind of scaled_dot_product_attention call (the query's shape and dtype, its flags)
    and the kernel torch would run it with on the GPU predicted for."""

    backend: str  # cudnn, flash, efficient or math
    query_shape: list[int]
    dtype: str
    is_causal: bool
    dropout: float
    mask: bool
    refused: list[str] = field(default_factory=list)  # "flash: a mask": each backend tried before it, and why


@dataclass
class Attention:
    """The attention kernels a CUDA prediction assumed, and what the choice followed (torch's rules, the cuDNN and
    CUDA versions, the GPU's compute capability)."""

    rule: str
    sites: list[AttentionSite]


@dataclass
class StreamUse:
    """A CUDA prediction of a run on several streams (FSDP2): what one stream's pool of the caching allocator got.
    The allocator keeps free blocks by stream, so memory freed on one stream is reserved for it alone."""

    stream: str  # "default", "fsdp all-gather copy-in", "fsdp reduce-scatter", ...
    allocated_bytes_by_category: dict[str, int]  # over the prediction, each storage by its category when freed
    reserved_at_peak_bytes: int  # the segments this stream's pool held at the peak of reserved memory
    source: str  # what is allocated on it, and where in the code that allocates it


@dataclass
class OnCard:
    """A CUDA prediction replayed under the GPU's memory, where unbounded it would reserve more than the card has:
    the caching allocator then releases its cached blocks and retries before it runs out (predict/device.py)."""

    capacity_bytes: int  # the GPU's nominal memory less the CUDA context and NCCL buffers estimated
    peak_reserved_bytes: int  # the peak of reserved memory under that capacity
    oom: bool  # out of memory even after releasing every cached block


@dataclass
class OffDevice:
    """A CUDA prediction: memory the run holds outside the caching allocator, so in neither allocated nor reserved
    (predict/emulate/off_device.py). Pinned host memory: offloaded activations, gradients and parameters, as torch's
    caching host allocator rounds them (to a power of two), at their peak; pageable host memory: an offloaded
    optimizer's state and step; unified memory: bitsandbytes' paged optimizer state (cudaMallocManaged), on the GPU
    while the step uses it and paged out to host memory under pressure."""

    pinned_host_peak_bytes: int = 0
    pageable_host_peak_bytes: int = 0
    unified_bytes: int = 0


@dataclass
class SettingsTried:
    """The same trace replayed under the same memory with other caching-allocator settings."""

    settings: str  # PYTORCH_CUDA_ALLOC_CONF text
    peak_reserved_bytes: int  # under the memory available (up to the failing allocation where it ran out)
    oom: bool


@dataclass
class Fragmented:
    """A CUDA prediction whose measured step's peak allocated fits the memory the allocator can have but whose
    reserved memory does not (predict/fragmentation.py): how much is fragmentation, and other settings tried."""

    capacity_bytes: int  # what the allocator can have: the card less the context and NCCL, or --memory-budget
    peak_allocated_bytes: int  # the measured step's, in whole blocks (max_memory_allocated)
    peak_reserved_bytes: int  # unbounded
    fragmentation_bytes: int  # peak reserved less peak allocated: held by the allocator, never in use at once
    oom_before_step: bool  # under the capacity it ran out before the measured step (construction or warm-up)
    allocated_at_oom_bytes: int  # allocated when it ran out, the failing request not included
    tried: list[SettingsTried] = field(default_factory=list)


@dataclass
class Memory:
    """Peak memory of the measured step(s), the phase and step it happened in, and its make-up by category."""

    device: str
    method: str
    peak_allocated_bytes: int
    peak_phase: Phase
    peak_step: int
    peak_reserved_bytes: int | None = None  # CUDA only: what the caching allocator held from the driver
    peak_active_bytes: int | None = None
    alloc_retries: int | None = None
    # CUDA only: cudaMemGetInfo's used memory, context and library workspaces included: the whole GPU's, so other
    # processes on the same GPU count too
    driver_used_bytes: int | None = None
    device_total_bytes: int | None = None
    breakdown_at_peak: dict[Category, int] | None = None
    current_bytes: int | None = None  # after the measured step: the steady state
    current_breakdown: dict[Category, int] | None = None
    build_peak_bytes: int | None = None  # model construction on the device
    build_host_peak_bytes: int | None = None  # model construction in host memory (exact)
    # Predictions for CUDA: reserved memory from the caching-allocator simulator (membench.allocator).
    reserved_method: str | None = None
    # PYTORCH_CUDA_ALLOC_CONF the simulation ran with (a prediction) or the allocator (a CUDA run); "default"
    allocator_settings: str | None = None
    allocator_peak_allocated_bytes: int | None = None  # what max_memory_allocated() would say (whole blocks)
    reserved_at_peak_allocated_bytes: int | None = None
    fragmentation_at_peak_bytes: int | None = None  # reserved minus allocated at the peak of reserved
    segments_allocated: int | None = None  # cudaMalloc calls
    reserved_oom: bool | None = None  # the simulated allocator ran out of the budget
    top_modules: list[ModuleBytes] | None = None  # the largest (module, category) at the peak, largest first
    top_sites: list[SiteBytes] | None = None  # CUDA: the largest allocation sites at the trace's peak
    attention: Attention | None = None  # CUDA predictions: the attention kernel assumed for each kind of call
    streams: list[StreamUse] | None = None  # predictions of several CUDA streams: each stream's share
    on_card: OnCard | None = None  # CUDA predictions that reserve more than the GPU holds: replayed under it
    off_device: OffDevice | None = None  # CUDA predictions: pinned host, pageable host and unified memory it holds
    peak_source: str | None = None  # predictions: what the peak is made of, where it can be named (LLM logits)
    fragmented: Fragmented | None = None  # CUDA predictions whose allocated fits and reserved does not


@dataclass
class Interleaved:
    """The run's step time against the baseline's, both timed in the run's own process, step for step in
    alternation (run, baseline, baseline, run, ...): a change in the machine's load during the run slows both
    alike and cancels in their ratio, where runs timed one after another would take it for the technique's cost.

    ratio: the median over pairs of (the run's step time / the baseline's); [ratio_low, ratio_high] its
    distribution-free interval (order statistics) at confidence `level`. Below 1: the run steps faster."""

    pairs: int
    ratio: float
    ratio_low: float
    ratio_high: float
    level: float
    run_median_s: float
    baseline_median_s: float


@dataclass
class Timing:
    """Step times after warm-up (median and spread), throughput, FLOPs and MFU."""

    step_times_s: list[float]
    median_s: float
    iqr_s: float
    min_s: float
    max_s: float
    noisy: bool
    warmup_steps: int | None = None
    samples_per_s: float | None = None
    throughput: float | None = None
    unit: str | None = None
    flops_per_step: int | None = None
    achieved_flops: float | None = None
    peak_flops: float | None = None
    mfu: float | None = None
    flops_not_counted: str | None = None  # why torch's FLOP counter could not count the step (the run stands)
    losses: list[float | None] | None = None
    build_s: float | None = None
    # A confidence interval for the median step time (order statistics) and its confidence: two runs whose
    # intervals overlap are within noise of each other.
    ci_low_s: float | None = None
    ci_high_s: float | None = None
    ci_level: float | None = None
    # The run against the baseline timed in alternation in one process (what a speed claim rests on), or why not.
    vs_baseline: Interleaved | None = None
    not_interleaved: str | None = None


@dataclass
class StateDiff:
    """How one part of the trained state (parameters, buffers, optimizer state) differs from the baseline's."""

    part: str
    tensors: int  # how many tensors were compared
    max_abs_diff: float
    scale: float  # what the difference is measured against: the largest update (or value, for optimizer state)
    relative_diff: float
    worst: str | None = None  # the tensor with the largest difference
    within_tolerance: bool = True


@dataclass
class Equivalence:
    """Whether the run trains the same model as the baseline, and how that was decided."""

    verdict: Verdict
    detail: str = ""
    parts: list[StateDiff] | None = None  # what was compared, part by part
    random_ops: list[str] | None = None  # random ops seen in the training step (dropout, ...)
    apart_from: str | None = None  # "dropout masks": equivalent once those were made deterministic for the check
    mode: Numerics | None = None
    compared: str | None = None
    max_abs_param_diff: float | None = None
    max_param_update: float | None = None
    relative_diff: float | None = None
    max_abs_loss_diff: float | None = None
    losses: list[float | None] | None = None
    reference_losses: list[float | None] | None = None


@dataclass
class TimelineInfo:
    """The recording pass's files (names relative to the result file) and the timeline's peak."""

    file: str
    file_bytes: int
    events: int
    points: int
    steps: int
    round_to: int
    peak_bytes: int
    peak_phase: Phase
    peak_step: int
    breakdown_at_peak: dict[Category, int]
    snapshot: str | None = None  # CUDA: the allocator's history, for pytorch.org/memory_viz
    snapshot_bytes: int | None = None
    snapshot_max_entries: int | None = None
    trace_entries: int | None = None
    trace_truncated: bool | None = None
    trace_peak_allocated_bytes: int | None = None
    top_modules: list[ModuleBytes] | None = None  # at the recording pass's peak
    top_sites: list[SiteBytes] | None = None  # CUDA: from the snapshot's frames at the trace's peak
    seconds: float | None = None  # the whole recording pass: its steps, and on CUDA the snapshot and its saving
    source: str | None = None  # CUDA: where the categories come from (the allocator's labelled history, ...)
    # Where the model's forward is compiled: the recording pass ran it eager (its tracker is a dispatch mode, under
    # which Dynamo runs compiled code eager), so the timeline is the eager model's; the measured step was compiled.
    ran_eager: str | None = None


@dataclass
class FileRef:
    file: str
    file_bytes: int


# --- the prediction beside a measurement (predict/beside.py) -------------------------------------------------------
@dataclass
class AllocationSide:
    """One side's event where a predicted step and the recorded one part ways: an allocation or a free, what it
    was (its category and module) and the Python line that allocated it. kind None: this side's step has ended."""

    kind: str | None = None  # "alloc" or "free"
    size: int | None = None  # requested bytes
    category: str | None = None
    module: str | None = None
    site: str | None = None


@dataclass
class Divergence:
    """The first event where the predicted step and the step the allocator recorded differ: `index` events (the
    step's allocations and frees, in order) were the same on both sides before it."""

    index: int
    predicted: AllocationSide
    measured: AllocationSide


@dataclass
class PredictionCheck:
    """The run predicted on fake tensors for the device it ran on, beside what it measured (membench run on CUDA,
    and on CPU for the CPU target). status "ok": compared; "skipped" or "error": why not, in `detail`."""

    status: str
    target: str  # "cpu", or the GPU the prediction was for and why (e.g. "H100: sm90, 132 SMs, as this GPU")
    detail: str | None = None
    tolerance: float | None = None  # relative: |predicted - measured| / measured within it counts as the same
    predicted_peak_allocated_bytes: int | None = None
    measured_peak_allocated_bytes: int | None = None
    predicted_peak_reserved_bytes: int | None = None
    measured_peak_reserved_bytes: int | None = None
    allocated_error: float | None = None  # (predicted - measured) / measured
    reserved_error: float | None = None
    within: bool | None = None
    divergence: Divergence | None = None
    hint: str | None = None  # outside the tolerance: which files to attach to a report
    seconds: float | None = None


@dataclass
class SavedTensor:
    """A tensor AOTAutograd's partitioner saves from the compiled forward for backward (its graph's name)."""

    name: str
    shape: list[int]
    dtype: str
    bytes: int


@dataclass
class Compiled:
    """A compiled run (techniques/compile.py): what Dynamo compiled, how long it took, and what of it fell outside
    the warm-up. Counted by Dynamo itself (torch._dynamo.utils.get_compilation_metrics, counters["graph_break"])."""

    mode: str
    options: str | None = None  # --compile-options as given
    compile_s: float = 0.0  # Dynamo's compilations (forward frames and backward graphs), their durations summed
    compilations: int = 0  # frames and backward graphs compiled, in the whole run
    graph_breaks: int = 0  # each one splits the model into more graphs (and keeps their boundaries' tensors)
    recompiles: int = 0  # frames compiled again after a guard failed
    after_warmup: int = 0  # compilations in the measured or timed steps (0: the warm-up compiled everything)
    cache_hits: int = 0  # AOTAutograd's and Inductor's on-disk caches: a hit skips most of compile_s
    cache_misses: int = 0
    memory_note: str | None = None  # what the memory figures mean for this mode (CUDA graphs' private pool)
    # A prediction: what the partitioner saves for backward (primals_* are the forward's inputs: parameters and the
    # batch, held anyway), and what of Inductor the prediction does not follow.
    saved: list[SavedTensor] | None = None
    approximated: str | None = None


@dataclass
class RankSummary:
    """One rank of a distributed run."""

    rank: int
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_phase: Phase | None = None
    build_peak_bytes: int | None = None
    build_host_peak_bytes: int | None = None
    breakdown_at_peak: dict[Category, int] | None = None
    median_s: float | None = None


@dataclass
class PredictedTime:
    """A prediction's step time on the GPU it is for, from the step's ops (membench/predict/time/): no GPU ran it.
    low_s and high_s: every efficiency figure at the fast and at the slow end of its published band."""

    gpu: str
    step_s: float
    low_s: float
    high_s: float
    by_class_s: dict[str, float]  # GPU busy seconds: gemm, attention, elementwise, optimizer, communication; and
    # launch: the time the GPU waits for the host to issue ops
    recomputed_s: float  # of the busy seconds, checkpointing's forward run again
    flops: int  # torch's FLOP counter's count, recomputation left out
    mfu: float | None  # flops / step_s against the dense peak of peak_dtype
    peak_dtype: str
    throughput: float  # units per second
    unit: str  # "samples" or "tokens"
    kernels: int
    method: str


@dataclass
class RunRecord:
    """One run's result file: what ran (spec), where (env), and what was measured or why not (status, error)."""

    name: str
    status: Status
    spec: Job
    env: Environment | None = None
    schema_version: int = SCHEMA_VERSION
    started: float | None = None
    wall_s: float | None = None
    memory: Memory | None = None
    timing: Timing | None = None
    equivalence: Equivalence | None = None
    timeline: TimelineInfo | None = None
    world_size: int | None = None
    ranks: list[RankSummary] | None = None
    oom_snapshot: FileRef | None = None
    error: str | None = None
    diverged_at_timed_step: int | None = None  # status diverged: the first timed step whose loss was not finite
    traceback: str | None = None
    log_tail: str | None = None
    predicted: bool = False
    predicted_for: Device | None = None
    # How closely the run's technique stack must match the baseline (techniques.Stack.numerics), recorded so that a
    # reader knows a run changes precision without the equivalence check or the technique registry. None: recorded
    # before membench stored it.
    numerics: Numerics | None = None
    # The stack's step-time cost class (techniques.cost_of), recorded so that a reader names the cheapest technique
    # without the registry (results/choice.py). None: recorded before membench stored it.
    cost: Cost | None = None
    cannot_see: list[str] | None = None
    prediction: PredictionCheck | None = None  # a measurement's own prediction, beside it (predict/beside.py)
    compiled: Compiled | None = None  # the compile technique's compilations (techniques/compile.py)
    # A prediction's answers to what it could not know (values read back, the eager model of a compiled one, rules
    # of another torch release), each with where it came from: predict/emulate/values.py and predict/run.py.
    assumed: list[str] | None = None
    timeline_error: str | None = None  # the recording pass failed (the run's other figures stand): why
    predicted_time: PredictedTime | None = None  # a CUDA prediction's step time (membench/predict/time/)
    # A run across nodes (spec.launch.nodes): the global rank whose record this is (its memory and timing are that
    # rank's); each node writes one, and a report merges them into the run's (results/nodes.py).
    rank: int | None = None
    path: Path | None = field(default=None, compare=False)  # where it was loaded from; never written

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def is_baseline(self) -> bool:
        return not self.spec.run.techniques

    @property
    def changes_precision(self) -> bool:
        """From the equivalence check when it ran; else from the stack's numerics as recorded (False when
        neither says: a record from before membench stored them)."""
        eq = self.equivalence
        if eq is not None and eq.verdict not in ("reference", "failed"):
            return eq.verdict == "precision" or eq.mode == "precision"
        return self.numerics == "precision"

    @property
    def peak(self) -> int | None:
        return self.memory.peak_allocated_bytes if self.memory else None

    @property
    def label(self) -> str:
        return f"{self.spec.run.workload} bs{self.spec.run.batch_size}"

    def to_json(self) -> str:
        data = {k: v for k, v in to_plain(self).items() if k != "path" and not (v is None and k not in _ALWAYS)}
        return json.dumps(data, indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "result") -> RunRecord:
        return cls.from_dict(parse_json(text, where), where)

    @classmethod
    def from_dict(cls, data: Any, where: str = "result") -> RunRecord:
        if not isinstance(data, dict) or "schema_version" not in data or "status" not in data:
            raise UserError(f"{where} is not a membench result (no schema_version/status)")
        version = data["schema_version"]
        if not isinstance(version, int) or isinstance(version, bool):
            raise UserError(f"{where}: field schema_version must be an integer, got {version!r:.40}")
        if version > SCHEMA_VERSION:
            raise UserError(f"{where} has schema {version}; this membench reads up to {SCHEMA_VERSION}: "
                            "upgrade membench")
        if version < 2:
            data = _upgrade_v1(data, where)
        record = build_checked(cls, data, where)
        # No memory reads as "not measured" (shown as -); a peak of 0 or less would read as a measured zero.
        if record.status == "ok" and record.memory is not None and record.memory.peak_allocated_bytes <= 0:
            raise UserError(f"{where}: status ok needs field memory.peak_allocated_bytes above 0 (a run that "
                            f"finished measured some memory), got {record.memory.peak_allocated_bytes}")
        record.schema_version = SCHEMA_VERSION
        return record


_ALWAYS = {"memory", "timing"}  # written even when empty, so a reader sees "not measured", not "missing"


def _upgrade_v1(data: dict, where: str) -> dict:
    """Schema 1 kept one flat spec; schema 2 splits it into what runs, how it is measured and how it is launched."""
    data = dict(data)
    spec = data.get("spec")
    if isinstance(spec, dict) and "run" not in spec:
        data["spec"] = Job.split_flat(spec)
    if isinstance(data.get("timeline"), dict) and "error" in data["timeline"]:
        data["timeline"] = None  # schema 1 stored a failed recording pass as a timeline with an error
    return data
