"""A prediction writes its warm-up step from its measured step (membench.predict.steady) instead of running it: its
trace (every allocation and free, in order) and its memory must be those of a prediction that runs the warm-up step."""

from __future__ import annotations

import dataclasses

import pytest

from membench.allocator.events import TraceEvent
from membench.api import plan
from membench.predict import steady
from membench.predict.run import predict_traced

TECHNIQUES = ["baseline", "accum", "ckpt", "opt-in-bwd", "amp-bf16", "amp-fp16", "bf16", "foreach-off", "fused-adam",
              "init-on-device", "sac", "expandable-segments", "ckpt+opt-in-bwd", "accum+ckpt", "amp-bf16+ckpt"]
CASES = ([("gpt-tiny", t, "adamw", "cuda") for t in TECHNIQUES]
         + [("gpt-tiny", t, o, "cuda") for o in ("adam", "sgd", "sgd-momentum", "adafactor")
            for t in ("baseline", "ckpt", "opt-in-bwd")]
         + [("vit-tiny", t, "adamw", "cuda") for t in ("baseline", "ckpt", "sac")]
         + [("tests.workloads:resnet18", "amp-bf16", "adamw", "cuda")]
         + [("gpt-tiny", t, "adamw", "cpu") for t in ("baseline", "ckpt", "amp-bf16")])


def _job(workload: str, technique: str, optimizer: str, device: str, **options):
    jobs = plan(workload=workload, techniques=technique, batch_size=4, target_device=device, in_process=True,
                optimizer=optimizer, **options)
    return next(j for j in jobs if j.name == technique)


def _canonical(events: list[tuple]) -> list[tuple]:
    """Keys numbered in the order storages are made; within a run of frees, any order: frees in a row leave the
    caching allocator in the same state whatever their order, and CPU autocast's weight cache frees its copies in
    the order of their addresses, which differs from process to process."""
    numbers: dict[int, int] = {}
    out, frees = [], []
    for event in [*events, ("end", -1)]:
        numbered = (event[0], numbers.setdefault(event[1], len(numbers)), *event[2:])
        if event[0] == "free":
            frees.append(numbered)
            continue
        out += sorted(frees) + [numbered]
        frees = []
    return out


def _reasons(monkeypatch) -> list:
    """What write_warmup answered for each prediction: a trace, or why it could not write one."""
    answers = []
    write = steady.write_warmup

    def recorded(*args, **kwargs):
        try:
            answers.append(write(*args, **kwargs))
        except steady.CannotWrite as exc:
            answers.append(str(exc))
            raise
        return answers[-1]

    monkeypatch.setattr(steady, "write_warmup", recorded)
    return answers


@pytest.mark.parametrize("workload, technique, optimizer, device", CASES, ids=["-".join(c) for c in CASES])
def test_a_written_warmup_step_is_the_one_a_prediction_runs(workload, technique, optimizer, device, monkeypatch):
    job = _job(workload, technique, optimizer, device)
    answers = _reasons(monkeypatch)
    written = predict_traced(job, derive_warmup=True)
    run = predict_traced(job, derive_warmup=False)
    assert dataclasses.asdict(written.memory) == dataclasses.asdict(run.memory)
    assert written.measured_from == run.measured_from
    assert _canonical(written.events) == _canonical(run.events)
    assert written.kernel_calls == run.kernel_calls  # where each call's kernel scratch is, for fit
    # Written, not run, except where a first step makes more than state and workspaces (the fp16 scaler's scale).
    assert isinstance(answers[0], str) == (technique == "amp-fp16"), answers[0]


def test_a_first_step_that_keeps_what_it_makes_runs_its_warmup_step(monkeypatch):
    """The `leaking` workload keeps each step's activations: the measured step would be taken for a first step."""
    job = _job("tests.workloads:leaking", "baseline", "adamw", "cuda")
    answers = _reasons(monkeypatch)
    written = predict_traced(job, derive_warmup=True)
    assert answers == ["the measured step made storages that outlive it, as a first step does"]
    run = predict_traced(job, derive_warmup=False)
    assert _canonical(written.events) == _canonical(run.events)


@pytest.mark.parametrize("options", [{"zero_grad": "zeros"}, {"optimizer": "tests.workloads:rmsprop"}])
def test_loops_whose_first_step_differs_run_it(options, monkeypatch):
    """Kept gradients are made by the first backward only; a user's optimizer may make its state anywhere."""
    optimizer = options.pop("optimizer", "adamw")
    answers = _reasons(monkeypatch)
    predict_traced(_job("gpt-tiny", "baseline", optimizer, "cuda", **options), derive_warmup=True)
    assert answers == []


def _events(*events: tuple) -> list[TraceEvent]:
    return [TraceEvent.of(e) for e in events]


def test_write_warmup_by_hand():
    """Construction made key 1 (a parameter); priming made 2 (its state) and 3 (a skipped batch); the measured step
    makes 10 (its batch), lets go of 3, makes 11 and 12 (activations), steps the optimizer at trace index 8, frees
    11 and 12, and leaves 13 for the cycle collector. The written warm-up is the measured step under new keys
    (offset 14), with the state made where the optimizer stepped and no earlier batch to let go of; the measured
    step then starts by freeing the warm-up's garbage, and lets go of the warm-up's batch, not the skipped one."""
    trace = _events(("alloc", 1, 100), ("alloc", 2, 100), ("alloc", 3, 8),
                    ("alloc", 10, 8), ("free", 3), ("alloc", 11, 4000), ("alloc", 12, 50), ("alloc", 13, 600),
                    ("free", 12), ("free", 11))
    primed = steady.Primed(start=1, optimizers=[7], state={7: _events(("alloc", 2, 100))}, state_params={7: {5}})
    seen = steady.Seen(steps={7: (8, {5})})
    written = steady.write_warmup(primed, seen, steady.MeasuredStep(trace, 3, garbage=[13], peak_bytes=4758,
                                                                    start_bytes=208, round_to=1))
    assert written.events == _events(("alloc", 1, 100),
                                     ("alloc", 24, 8), ("alloc", 25, 4000), ("alloc", 26, 50), ("alloc", 27, 600),
                                     ("alloc", 2, 100), ("free", 26), ("free", 25),
                                     ("free", 27),
                                     ("alloc", 10, 8), ("free", 24), ("alloc", 11, 4000), ("alloc", 12, 50),
                                     ("alloc", 13, 600), ("free", 12), ("free", 11))
    assert written.measured_from == 8
    # A peak no higher than the warm-up's garbage on top of the start: the written trace would miss it.
    with pytest.raises(steady.CannotWrite, match="peak is not above what a warm-up step would leave"):
        steady.check(primed, seen, steady.MeasuredStep(trace, 3, garbage=[13], peak_bytes=808, start_bytes=208,
                                                       round_to=1))
