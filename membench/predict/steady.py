"""A prediction's warm-up step, written from its measured step instead of run.

A prediction runs one warm-up step so that the measured step finds what a training loop's steady state holds: the
optimizer state (the first optimizer step makes it) and the cuBLAS workspaces (the first matmul on each thread makes
one); reserved memory is simulated over the allocations of both steps. But the warm-up's forward and backward make
the measured step's allocations, in its order and sizes (the same ops on the same shapes), and running them on fake
tensors was half of a prediction's time. So the warm-up is primed instead: the workspaces are made, each optimizer
makes its state (Adam and AdamW as their first step does, without its arithmetic; others by one step on zero
gradients), and then the measured step runs. The warm-up's allocations are then
written from the measured step's: its events under new keys, with each optimizer's state made where that optimizer's
first step began and each workspace where its thread's first matmul ran, which is where a run's first step makes
them.

That holds only where the first step differs from the next by exactly those allocations, so it is checked, and a
prediction that fails a check runs its warm-up step after all (predict/run.py). What the measured step allocated may
outlive it only as garbage the cycle collector frees (checkpointing's recomputation state, which a run frees at the
next step's start, as written here); nothing made before it may be freed in it; every optimizer that made state
stepped in it, with a gradient for each parameter it made state for (a parameter that gets no gradient gets no
state in a real first step); every workspace made was used. A first step that makes anything else (a gradient
scaler's scale, a lazily built buffer) leaves it alive after the measured step, and fails the first check.
tests/predict/test_steady.py compares the two ways allocation for allocation on every technique.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from dataclasses import dataclass, field

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from membench import private
from membench.allocator.events import TraceEvent
from membench.measure import Session

# Optimizers whose first step's state, written where the step begins, gives the trace a run warm-up step gives
# (one parameter group; SGD with momentum makes its buffer first thing in its arithmetic): tests/predict/test_steady.py
# compares each, with every technique it takes. A user's optimizer may make its state anywhere: its warm-up is run.
DERIVABLE_OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor")


@dataclass
class Primed:
    """What the primed warm-up made, for writing the warm-up step's allocations."""

    start: int  # the trace's length before priming: what came before is construction
    optimizers: list[int]  # ids, in the order the step code steps them
    state: dict[int, list[TraceEvent]] = field(default_factory=dict)  # id(optimizer) -> allocations of its state
    state_params: dict[int, set[int]] = field(default_factory=dict)  # id(optimizer) -> ids of its parameters
    workspaces: dict[str, TraceEvent] = field(default_factory=dict)  # thread -> its workspace's allocation


@dataclass
class Seen:
    """Where in the measured step each first happened: the trace's length at each optimizer's first step (with the
    parameters that had a gradient then), and where each thread's workspace is made (after its first matmul's
    output)."""

    steps: dict[int, tuple[int, set[int]]] = field(default_factory=dict)
    first_use: dict[str, int] = field(default_factory=dict)


def prime(session: Session) -> Primed | None:
    """Make what a first step makes and keeps: the workspaces, each optimizer's state (on zero gradients, let go
    after). None where that cannot be told apart from the rest (then the warm-up step is run)."""
    tracker = session.meter.tracker
    trace = tracker.trace
    gc.collect()  # what construction left for the collector goes now, as at a run's first step
    primed = Primed(start=len(trace), optimizers=[id(o) for o in session.state.optimizers])
    made: dict[int, list[TraceEvent]] = {}
    with session.meter.active(), session.meter.phase("optimizer"):
        if tracker.kernels is not None:
            for thread in ("main", "autograd"):
                before = len(trace)
                tracker.kernels.workspaces.make(thread, tracker)
                primed.workspaces[thread] = trace[before]
        for optimizer in session.state.optimizers:
            if len(optimizer.param_groups) != 1:
                return None  # a group's state is made before that group's step, after the previous group's
            for p in optimizer.param_groups[0]["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
            before = len(trace)
            if not private.make_adam_state(optimizer):  # Adam's without its arithmetic: an eighth of opt-in-bwd's
                optimizer.step()
            made[id(optimizer)] = _outliving(trace[before:])
            optimizer.zero_grad(set_to_none=True)
            primed.state_params[id(optimizer)] = {id(p) for p, state in optimizer.state.items() if state}
    gc.collect()
    kept = {e.key for e in _outliving(trace[primed.start:])}
    for key, events in made.items():
        primed.state[key] = [e for e in events if e.key in kept]
    accounted = {e.key for events in primed.state.values() for e in events} | {
        e.key for e in primed.workspaces.values()}
    return primed if kept == accounted else None


@contextlib.contextmanager
def watching(session: Session):
    """Around the measured step: note where each optimizer first steps and each thread first runs a matmul."""
    seen = Seen()
    trace = session.meter.tracker.trace
    kernels = session.meter.tracker.kernels

    def began(optimizer, args, kwargs) -> None:
        if id(optimizer) not in seen.steps:
            seen.steps[id(optimizer)] = (len(trace), {
                id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None})

    if kernels is not None:
        kernels.workspaces.first_use = seen.first_use
    handle = register_optimizer_step_pre_hook(began)
    try:
        yield seen
    finally:
        handle.remove()


class CannotWrite(Exception):
    """Why a warm-up step cannot be written from the measured step (then it is run): one of `check`'s checks."""


@dataclass
class MeasuredStep:
    """The primed prediction's trace and what its measured step showed: what the warm-up step is written from."""

    trace: list[TraceEvent]  # construction, priming, then the measured step from measured_from
    measured_from: int
    garbage: list[int]  # keys the measured step allocated that the cycle collector freed after it, in that order
    peak_bytes: int  # the measured step's peak, in round_to-byte blocks
    start_bytes: int  # what was live at its start, likewise
    round_to: int
    calls: list = field(default_factory=list)  # the trace's kernel calls (predict/emulate/registry.KernelCall)


@dataclass
class Plan:
    """How a warm-up step is written, once `check` has found that it can be: the batch each step replaces, and what
    the first step makes and keeps, by where it is made."""

    replaced: dict[int, int]  # key the measured step let go of (the earlier batch) -> the key it made in its place
    inserts: list[tuple[int, int, list[TraceEvent]]]  # (index in the measured step, order there, events), sorted


@dataclass
class Written:
    """The trace a prediction that ran its warm-up step would have made."""

    events: list[TraceEvent]
    measured_from: int  # where its measured step begins
    kernel_calls: list  # predict/emulate/registry.KernelCall, each where it is in `events`


def write_warmup(primed: Primed, seen: Seen, step: MeasuredStep) -> Written:
    """The trace a prediction that ran its warm-up step would have made, with its kernel calls; CannotWrite, with
    the check that failed, where that cannot be written."""
    return write(primed, step, check(primed, seen, step))


def check(primed: Primed, seen: Seen, step: MeasuredStep) -> Plan:
    """Whether the first step differs from the measured one only by what priming made (see the module's docstring),
    and how to write it; CannotWrite, saying which check failed, where it does not."""
    measured = step.trace[step.measured_from:]
    made = {e.key: e.size for e in measured if e.kind == "alloc"}
    garbage = set(step.garbage)
    # What a step replaces (the batch: the data loader lets go of the last one as it makes the next) is made by
    # one step and freed by the next; in the primed prediction the one before the measured step's is the batch
    # session.skip made. Paired in the order they were made, size for size, with what the measured step made and
    # kept.
    earlier = {e.key: e.size for e in step.trace[primed.start:step.measured_from] if e.kind == "alloc"}
    freed_before = [e.key for e in measured if e.kind == "free" and e.key not in made]
    kept = [e for e in _outliving(measured) if e.key not in garbage]
    if any(key not in earlier for key in freed_before):
        raise CannotWrite("the measured step freed storages made before it")
    made_order = sorted(freed_before)  # keys count up as storages are made
    if [earlier[key] for key in made_order] != [e.size for e in kept]:
        raise CannotWrite("the measured step made storages that outlive it, as a first step does")
    # A run's measured step starts with the warm-up's garbage still live (the collector frees it as the step takes
    # its batch); a peak no higher than that start would be there, and the primed step cannot see it.
    blocks = lambda size: -(-size // step.round_to) * step.round_to  # noqa: E731
    if step.peak_bytes <= step.start_bytes + sum(blocks(made[k]) for k in step.garbage):
        raise CannotWrite("the measured step's peak is not above what a warm-up step would leave at its start")
    return Plan({old: new.key for old, new in zip(made_order, kept)}, _inserts(primed, seen, step.measured_from))


def _inserts(primed: Primed, seen: Seen, measured_from: int) -> list[tuple[int, int, list[TraceEvent]]]:
    """What a first step makes and keeps, where in the measured step it makes it: each optimizer's state where it
    first stepped, each workspace where its thread's first matmul ran; CannotWrite where one of them did not."""
    inserts = []
    for optimizer in primed.optimizers:
        state = primed.state[optimizer]
        if not state:
            continue
        if optimizer not in seen.steps:
            raise CannotWrite("an optimizer with state did not step in the measured step")
        at, with_grad = seen.steps[optimizer]
        if with_grad != primed.state_params[optimizer]:
            raise CannotWrite("an optimizer's parameters with gradients are not those it made state for")
        inserts.append((at - measured_from, 0, state))
    for thread, event in primed.workspaces.items():
        if thread not in seen.first_use:
            raise CannotWrite(f"no matmul ran on the {thread} thread")
        inserts.append((seen.first_use[thread] - measured_from, 1, [event]))
    return sorted(inserts, key=lambda x: x[:2])


def write(primed: Primed, step: MeasuredStep, plan: Plan) -> Written:
    """The warm-up step written as `check` planned it: the measured step's events under new keys, with what the
    first step makes and keeps inserted, and no earlier batch to let go of; then the warm-up's garbage collected,
    and the measured step letting go of the warm-up's batch."""
    trace, measured_from = step.trace, step.measured_from
    measured = trace[measured_from:]
    inserts = list(plan.inserts)
    offset = 1 + max(e.key for e in trace)  # the warm-up's storages: the measured step's, under new keys
    warmup: list[TraceEvent] = []
    # Where a kernel call at each event of the measured step is in the warm-up: before what is inserted there (a
    # call that took no scratch is where the op ended, and an optimizer stepped in backward after it).
    at_in_warmup = []
    for index, event in enumerate(measured):
        at_in_warmup.append(primed.start + len(warmup))
        while inserts and inserts[0][0] <= index:
            warmup.extend(inserts.pop(0)[2])
        if event.key not in plan.replaced:  # a first step has no earlier batch to let go of
            warmup.append(TraceEvent(event.kind, event.key + offset, event.size, event.stream))
    for _, _, events in inserts:
        warmup.extend(events)
    prefix = trace[:primed.start] + warmup
    collected = [TraceEvent.free(key + offset) for key in step.garbage]
    measured_step = [TraceEvent.free(plan.replaced[e.key] + offset) if e.key in plan.replaced else e
                     for e in measured]
    shift = len(prefix) + len(collected) - measured_from
    calls = step.calls
    written_calls = ([c for c in calls if c.at < primed.start]
                     + [dataclasses.replace(c, at=at_in_warmup[c.at - measured_from]) for c in calls
                        if c.at >= measured_from]
                     + [dataclasses.replace(c, at=c.at + shift) for c in calls if c.at >= measured_from])
    return Written(prefix + collected + measured_step, len(prefix), written_calls)


def _outliving(events: list[TraceEvent]) -> list[TraceEvent]:
    """The allocations among events that no later event frees, in order."""
    alive: dict[int, TraceEvent] = {}
    for e in events:
        if e.kind == "alloc":
            alive[e.key] = e
        else:
            alive.pop(e.key, None)
    return list(alive.values())
