"""The answer `membench predict` ends with: does the step fit the target GPU, by how much, and if the baseline does
not, the cheapest listed technique that does; then at most three lines on what the prediction assumed.

Read by the CLI's own process, which never imports torch: only result records, the GPU table and the technique
registry's metadata. What "fits" is measured against is decided in one place, `device_peak`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from membench.common.units import fmt_bytes
from membench.predict.device import run_mesh, whole_device
from membench.predict.gpus import Gpu
from membench.results import RunRecord
from membench.results.choice import changes, changes_phrase, cost_phrase, order
from membench.techniques import REGISTRY, cost_of


@dataclass
class Fit:
    """What fit answers for one technique (predict/fit.py searches for it): batch fits (peak <= budget), batch +
    step does not (or max_batch was reached)."""

    run: str
    batch: int  # 0: not even the smallest batch fits
    peak: int | None  # predicted peak at `batch`
    step: int  # batch sizes this stack accepts are multiples of it (accumulation needs equal micro-batches)
    over_batch: int | None  # the smallest batch tried that does not fit
    over_peak: int | None
    probes: int
    confirmed: int | None = None  # largest batch that ran without OOM on the GPU, when confirmed
    note: str = ""
    simulations: int = 0  # batches evaluated from derived allocations (no prediction)
    method: str = "full search"
    fails_below: list[int] = field(default_factory=list)  # smaller batches that do not fit (reserved memory)
    over: str = "batch"  # what was searched: the batch, or (fit --by seq-len) the sequence length at a fixed batch
    # fit --objective speed: the predicted step time and throughput at `batch` (membench/predict/time/)
    step_s: float | None = None
    throughput: float | None = None
    unit: str = ""


@dataclass(frozen=True)
class DevicePeak:
    """What a prediction says a rank holds on the device at its peak, and what that number is."""

    nbytes: int
    what: str  # e.g. "peak reserved": said in the fits line


def device_peak(record: RunRecord) -> DevicePeak | None:
    """The one number the fits line compares with the GPU's memory: the whole-device estimate at the peak of
    reserved (predict/device.py: reserved + the CUDA context + NCCL's buffers), with reserved as replayed under the
    card where the unbounded simulation reserves more than it holds (the allocator releases cached blocks first);
    where even that runs out of memory, the unbounded figure, which does not fit."""
    memory = record.memory
    if record.status != "ok" or memory is None or memory.peak_reserved_bytes is None:
        return None
    card = memory.on_card
    reserved = card.peak_reserved_bytes if card is not None and not card.oom else memory.peak_reserved_bytes
    off = getattr(memory, "off_device", None)
    unified = off.unified_bytes if off else 0  # paged optimizer state, resident while it steps
    return DevicePeak(whole_device(reserved, run_mesh(record.spec.run), unified).total, "whole device")


@dataclass(frozen=True)
class Fitting:
    """One prediction against the GPU's memory: margin > 0 is room to spare, < 0 is how far over."""

    record: RunRecord
    peak: DevicePeak
    margin: int

    @property
    def fits(self) -> bool:
        return self.margin >= 0


def fitting(records: list[RunRecord], capacity: int) -> list[Fitting]:
    return [Fitting(r, peak, capacity - peak.nbytes) for r in records for peak in [device_peak(r)] if peak]


def cheapest(fits: list[Fitting]) -> Fitting | None:
    """Of the runs that fit, the one whose techniques cost least in step time (their declared cost class), then one
    that trains the same model (not a precision change), then the fewest techniques, then the most room."""
    candidates = [f for f in fits if f.fits]
    if not candidates:
        return None

    def key(f: Fitting):
        r, names = f.record, f.record.spec.run.techniques
        return order(r.cost or cost_of(names), r.numerics or stack_numerics(names), len(names), f.margin)

    return min(candidates, key=key)


def stack_numerics(names: tuple[str, ...]) -> str | None:
    """The numerics of the first technique in the stack that changes something (results/choice.py), else
    "exact": read from the registry, as a prediction has no equivalence check."""
    return next((REGISTRY[n].numerics for n in names if n in REGISTRY and changes(REGISTRY[n].numerics)), "exact")


def _with_changes(names: tuple[str, ...]) -> str:
    """What a named stack changes, in a word: the model trained (an adapter), else its numerics (results/choice)."""
    trains = next((REGISTRY[n].trains for n in names if n in REGISTRY and REGISTRY[n].trains), "")
    said = f"trains {trains}" if trains else changes_phrase(stack_numerics(names))
    return f"; {said}" if said else ""


def capacity(gpu: Gpu) -> int:
    """The card's memory as sold (GB of 10**9 bytes), what the fits line compares the whole-device estimate with
    (as predict/device.py's fits_on)."""
    return gpu.memory_bytes


def _gb(gpu: Gpu) -> str:
    return f"{gpu.name} ({gpu.memory_label} = {fmt_bytes(capacity(gpu))})"


def answer(records: list[RunRecord], gpu: Gpu) -> str:
    """One line: whether the baseline fits `gpu`, by how much, and what fits when it does not; under a
    --memory-budget, whether each run's reserved memory fits the budget."""
    budget = next((r.spec.run.memory_budget for r in records if r.spec.run.memory_budget), None)
    if budget is not None:
        return _under_budget(records, budget)
    fits = fitting(records, capacity(gpu))
    per_rank = " per rank" if any((r.world_size or 1) > 1 for r in records) else ""
    where = _gb(gpu)
    base = next((f for f in fits if f.record.name == "baseline"), None)
    if base is None:
        failed = next((r for r in records if r.name == "baseline"), None)
        why = f" ({_first_line(failed.error)})" if failed is not None and failed.error else ""
        head = f"{where}: the baseline could not be predicted{why}"
    elif base.fits:
        return (f"{where}: baseline fits{per_rank}, {fmt_bytes(base.margin)} to spare ({base.peak.what} "
                f"{fmt_bytes(base.peak.nbytes)}).")
    else:
        head = (f"{where}: baseline does not fit{per_rank}: {fmt_bytes(-base.margin)} over ({base.peak.what} "
                f"{fmt_bytes(base.peak.nbytes)})")
    best = cheapest([f for f in fits if f.record.name != "baseline"])
    if best is not None:
        names = best.record.spec.run.techniques
        said = _with_changes(names).removeprefix("; ")
        return (f"{head}; cheapest listed that fits: {best.record.name} ({_cost(names)}{'; ' + said if said else ''}, "
                f"{fmt_bytes(best.margin)} to spare).")
    others = [f for f in fits if f.record.name != "baseline"]
    if others:
        low = max(others, key=lambda f: f.margin)
        return f"{head}; no listed technique fits: the lowest, {low.record.name}, is {fmt_bytes(-low.margin)} over."
    return head + "."


def _under_budget(records: list[RunRecord], budget: int) -> str:
    """Each run's reserved memory against the budget the simulated allocator had (a memory fraction)."""
    said = []
    for r in records:
        m = r.memory
        if r.status != "ok" or m is None or m.peak_reserved_bytes is None:
            continue
        said.append(f"{r.name} runs out of memory" + (" (fragmentation: see above)" if m.fragmented else "")
                    if m.reserved_oom else f"{r.name} fits ({fmt_bytes(budget - m.peak_reserved_bytes)} to spare)")
    return f"--memory-budget {fmt_bytes(budget)} for the caching allocator: " + "; ".join(said) + "."


# Answers said on a line of their own, not folded with the values assumed: a compiled model predicted eager
# (predict/compiled.py's PREFIX) and a torch release whose CUDA rules were not checked (predict/emulate/versions.py's
# notice). Matched as text: this module is read where torch is not imported.
ALONE = ("torch.compile:", "CUDA rules not checked on this release")


def assumptions(records: list[RunRecord], gpu: Gpu | None, explain: bool, attention: str | None = None,
                why: str | None = None) -> list[str]:
    """What the prediction assumed: two lines, and a third with the attention kernels it assumed (the child's
    predict/emulate/sdpa.describe line) or else the first value it answered without knowing (each record's
    cannot_see and assumed hold the full lists), or with `explain` every item, one per line. `why`: why this GPU
    (the default target when --gpu was not given). A compiled model and an unchecked torch release each get a line."""
    seen = next((r.cannot_see for r in records if r.cannot_see), None) or []
    if gpu is None:  # the CPU tracker is what the prediction reproduces: no CUDA caveat applies
        lines = ["PREDICTED cpu memory (no timing): what `membench run --device cpu` measures, to the byte where the",
                 "model does not branch on tensor values."]
    else:
        chosen = f" ({why})" if why else ""
        lines = [f"PREDICTED (no timing) for {_gpu_in_short(gpu)}{chosen}, with CUDA's autocast and kernels;",
                 "reserved memory from the caching-allocator simulator" + _not_seen(seen, explain)]
        lines += [f"{gpu.name}: {gpu.assumed()}"] if gpu.given else []
    everything = list(dict.fromkeys(a for r in records for a in (r.assumed or [])))
    alone = [a for a in everything if any(mark in a for mark in ALONE)]
    assumed = [a for a in everything if a not in alone]
    lines += alone
    if explain:
        return (lines + ["A prediction cannot see:"] + [f"  - {item}" for item in seen]
                + ([attention] if attention else [])
                + (["Answered without knowing (each record's `assumed`):"] if assumed else [])
                + [f"  - {item}" for item in assumed])
    if attention:  # the kernel torch would choose on the GPU (predict/emulate/sdpa.py), in full: it is a choice
        more = f"; and {len(assumed)} values assumed (--explain)" if assumed else ""
        lines.append(attention + more)
    elif assumed:  # values read back, rules of another release: predict/emulate/values.py
        more = f" and {len(assumed) - 1} more (--explain)" if len(assumed) > 1 else ""
        lines.append(f"Assumed: {_first_line(assumed[0])}{more}.")
    return lines


def _cost(techniques: tuple[str, ...]) -> str:
    return cost_phrase(cost_of(techniques))


def _what_changes(techniques: tuple[str, ...]) -> str:
    """What a stack trains instead of the baseline's model (lora: "trains an adapter"), or that it changes the
    numerics on purpose (bf16); "" for a stack that trains the same model."""
    classes = [REGISTRY[n] for n in techniques if n in REGISTRY]
    trains = next((c.trains for c in classes if c.trains), "")
    if trains:
        return f"trains {trains}"
    return "changes precision" if any(c.numerics == "precision" for c in classes) else ""


def _gpu_in_short(gpu: Gpu) -> str:
    major, minor = gpu.compute_capability
    return f"{gpu.name} (sm{major}{minor})"


def _not_seen(seen: list[str], explain: bool) -> str:
    if not seen or explain:
        return "."
    return f"; not seen: {_first_clause(seen[0])} and {len(seen) - 1} more (--explain)."


def _first_line(text: str, width: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[:width] + "..."


def _first_clause(text: str) -> str:
    return text.split(" (")[0].split(";")[0]


def fit_answer(fits: list[Fit], budget: int, by: str, gpu: Gpu | None) -> str:
    """One line: the baseline's largest batch within the budget, or, when not even its smallest batch fits, by how
    much it is over and the cheapest listed technique that fits."""
    where = f"{gpu.name}, " if gpu is not None else ""
    word = fits[0].over if fits else "batch"
    head = f"{where}within {fmt_bytes(budget)} of predicted peak {by}"
    base = next((f for f in fits if f.run == "baseline"), None)
    others = [f for f in fits if f.run != "baseline" and f.batch]
    def key(f: Fit):
        names = tuple(f.run.split("+"))
        return order(cost_of(names), stack_numerics(names), len(names), f.batch)

    best = min(others, key=key, default=None)
    cheapest_text = (f"cheapest listed that fits: {best.run} (up to batch {best.batch}, "
                     f"{_cost(tuple(best.run.split('+')))}{_with_changes(tuple(best.run.split('+')))})"
                     ) if best else "no listed technique fits"
    if base is None:
        return f"{head}: {cheapest_text}."
    if base.batch:
        spare = f", {fmt_bytes(budget - base.peak)} to spare" if base.peak is not None else ""
        larger = max(others, key=lambda f: f.batch, default=None)
        change = _what_changes(tuple(larger.run.split("+"))) if larger is not None else ""
        more = (f"; the largest {word}: {larger.run} at {larger.batch}{f' (but {change})' if change else ''}"
                if larger is not None and larger.batch > base.batch else "")
        return f"{head}: the baseline trains at most {word} {base.batch}{spare}{more}."
    over = (f": {fmt_bytes(base.over_peak - budget)} over at {word} {base.over_batch}"
            if base.over_batch and base.over_peak is not None else "")
    return f"{head}: the baseline does not fit even its smallest {word}{over}; {cheapest_text}."


def fit_assumptions(gpu: Gpu | None, by: str, checked: str, cannot_see: list[str], explain: bool) -> list[str]:
    """What the fit assumed, in two lines (with `explain`: every item a prediction cannot see). `checked`: whether
    real runs confirmed it, and if not why not (the CLI's `confirmation`)."""
    if gpu is None:
        lines = [f"PREDICTED cpu peak {by} (no timing): what `membench run --device cpu` measures."]
    else:
        lines = [f"PREDICTED (no timing) for {_gpu_in_short(gpu)}; {checked}."]
    if by == "device":  # predict/device.py's parts: the CUDA context and NCCL's buffers are estimates
        lines[0] = lines[0][:-1] + "; peaks include the estimated CUDA context and NCCL buffers (`membench predict`)."
    lines += [f"{gpu.name}: {gpu.assumed()}"] if gpu is not None and gpu.given else []
    if explain:
        return lines + ["A prediction cannot see:"] + [f"  - {item}" for item in cannot_see]
    if cannot_see:
        lines.append(f"Leave headroom for what it cannot see: {_first_clause(cannot_see[0])} and "
                     f"{len(cannot_see) - 1} more (--explain).")
    return lines
