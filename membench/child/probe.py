"""The probes' child side, in their own process, where importing and calling the user's code cannot hang, abort or
crash the sweep itself (the launcher starts them and waits):

- `python -m membench.child.probe PLAN_ARGS.json` (probe.probe): the arguments of `plan.plan` in, one line of JSON
  out, {"jobs": [...]} or {"error": "one line"}.
- `python -m membench.child.probe --call KIND REQUEST.json ANSWER.json` (probe.call_isolated): predict or
  fit, from loading the user's code to the answer, written to a file (the user's prints never mix with it).
"""

# ruff: noqa: E402 - the imports come after the collector is turned off
from __future__ import annotations

import gc

if __name__ == "__main__":
    # Importing torch and torch._dynamo makes millions of objects, and the cycle collector would walk them again and
    # again as they come: a sixth of the loading here (torch 2.14.1, 2-core x86_64). Off until they are imported,
    # before the user's code runs (main).
    gc.disable()

import contextlib
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

from membench import private
from membench.common.errors import UserError, failure_line
from membench.common.fsio import make_dir
from membench.common.units import fmt_bytes
from membench.launch import lifeline
from membench.launch.pool import WorkerDied, run_in_order
from membench.launch.sweep import LOCK_NAME, locked
from membench.plan import plan
from membench.predict.device import outside_allocator
from membench.predict.emulate.sdpa import describe
from membench.predict.fit import Fit, default_jobs, fit_batch, longest_sequence
from membench.predict.run import (
    CANNOT_SEE,
    CannotPredict,
    ModelCache,
    check_predictable,
    default_predict_dir,
    predict_all,
    predict_traced,
    refuse_over_measurements,
)
from membench.results import RunRecord, archive
from membench.spec import Job, RunSpec
from membench.techniques import resolve


def plan_here(args: dict) -> dict:
    """The jobs of the sweep `args` describe, planned in this process, or why not."""
    try:
        return {"jobs": [job.to_dict() for job in plan(**args, in_process=True)]}
    except UserError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the user's factory raising: its message is the answer
        return {"error": f"workload {args.get('workload')!r} raised {type(exc).__name__}: {exc}"}


def call_here(kind: str, request: dict) -> dict:
    """probe.call_isolated's child: predict or fit, from loading the user's code to the answer."""
    try:
        return {"predict": predict_request, "fit": fit_request}[kind](request)
    except UserError as exc:
        return {"error": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - the user's code raising, or SystemExit from it: one line
        return {"error": failure_line(exc, request.get("workload") or request.get("plan", {}).get("workload"))}


def predict_out(request: dict) -> Path:
    """request["out"], else the default folder (named after this machine and its torch, which the CLI's process
    never imports); made, and absolute before the user's code runs (it may change the working directory)."""
    if request.get("out"):
        return make_dir(Path(request["out"])).resolve()
    p = request["plan"]
    return make_dir(default_predict_dir(RunSpec(workload=p["workload"], batch_size=p["batch_size"],
                                                device=p["target_device"]))).resolve()


def predict_request(request: dict) -> dict:
    """In the child process of `membench predict` (launch.probe.call_isolated), the one that imports torch: lock
    the folder (a sweep writing there, or another prediction, is refused), plan the runs (loading the user's code),
    predict each into it, say how each went on stderr; the answer names the folder and the result files."""
    new = _new_folders(request)
    out = predict_out(request)
    with locked(out):
        try:
            return _predict_into(request, out)
        except BaseException:  # refused (a workload that does not load, a measurement in the way): nothing left
            _remove_new_folders(out, new)
            raise


def _new_folders(request: dict) -> list[Path]:
    """The folders predict_out is about to create, innermost first."""
    p = request["plan"]
    path = Path(request["out"]) if request.get("out") else default_predict_dir(
        RunSpec(workload=p["workload"], batch_size=p["batch_size"], device=p["target_device"]))
    return [f for f in [path.absolute(), *path.absolute().parents] if _absent(f)]


def _absent(path: Path) -> bool:
    try:
        return not path.exists()
    except OSError:  # a name the file system refuses (too long): make_dir says so in one line
        return True


def _remove_new_folders(out: Path, new: list[Path]) -> None:
    """Remove the folders a refused prediction created, and its lock file, while it still holds the lock: a writer
    that opened the lock file since is refused, one that comes later finds no folder or makes its own (rmdir of a
    folder that is no longer empty fails, and the folder stays)."""
    if not new:
        return
    with contextlib.suppress(OSError):
        (out / LOCK_NAME).unlink()
        for folder in new:
            folder.rmdir()


def _predict_into(request: dict, out: Path) -> dict:
    jobs = plan(**request["plan"], in_process=True)
    refuse_over_measurements(jobs, out)

    def start(job: Job) -> None:  # a large model takes a while per run: say which one is going
        archive(out, job.name)  # an earlier prediction moves to previous/, as a run's result does
        print(f"predicting {job.name} ...", file=sys.stderr, flush=True)

    def done(job: Job, record: RunRecord) -> None:
        why = f": {record.error.splitlines()[0]}" if record.status != "ok" and record.error else ""
        print(f"predicted {job.name}: {record.status} ({record.wall_s:.1f} s){why}", file=sys.stderr, flush=True)
        if record.traceback:  # a membench bug, not the user's: show where
            print(record.traceback, file=sys.stderr, flush=True)

    workers = _workers(request.get("jobs"), len(jobs), "techniques predicted one at a time")
    cache = ModelCache()  # one worker's (or the serial loop's) predictions share the workload's meta model
    if workers > 1:
        records = in_forks(jobs, lambda job: predict_all([job], out, on_start=start, on_done=done, cache=cache)[0],
                           workers, request["plan"].get("workload"), "predicting")
    else:
        records = predict_all(jobs, out, on_start=start, on_done=done, cache=cache)
    attentions = [r.memory.attention for r in records if r.memory is not None and r.memory.attention is not None]
    # Folded here, where torch is imported already: the CLI's process prints it without importing torch.
    return {"names": [job.name for job in jobs], "out": str(out), "attention": describe(attentions),
            "target": _target(request["plan"]), "arch": _arch(jobs)}


def _workers(asked: int | None, jobs: int, serially: str) -> int:
    """How many processes predict or fit `jobs` runs: --jobs, else this machine's cores; one where this process
    cannot fork (saying so)."""
    workers = min(asked or default_jobs(), jobs)
    reason = fork_refused() if workers > 1 else None
    if reason is not None:
        print(f"membench: this process cannot fork ({reason}): {serially}", file=sys.stderr, flush=True)
        workers = 1
    return workers


def _target(plan: dict) -> str | None:
    """Why a CUDA prediction without --gpu is for the GPU it is for (plan.plan chose it), for the output."""
    from membench.predict.gpus import default_target

    return default_target().why if plan.get("target_device") == "cuda" and plan.get("gpu") is None else None


def _arch(jobs: list[Job]) -> str | None:
    """The line saying the installed torch cannot run on the GPU predicted for, or None (predict/gpus.arch_note)."""
    from membench.predict.gpus import arch_note, predicted_for

    return arch_note(predicted_for(jobs[0].run)) if jobs and jobs[0].run.device == "cuda" else None


def world_request(request: dict) -> dict:
    """`membench fit --by world-size` in the child: each technique's smallest world size within the budget per rank
    (predict/fit/world.py), each prediction shown on stderr as the search goes."""
    from membench.predict.fit.world import rank_peak, smallest_world
    from membench.predict.run import predict
    from membench.techniques import resolve

    budget = request["budget"]

    cache = ModelCache()  # every world size tried starts from one meta model

    def peak_at(job: Job) -> int | None:
        record = predict(job, cache=cache)
        if record.status != "ok":
            raise UserError(f"cannot fit {job.name} at {job.run.nproc_per_node} ranks: {record.error}")
        return rank_peak(record)

    fits = []
    for job in plan(**request["plan"], in_process=True):
        def probe(world: int, peak: int | None, name=job.name) -> None:
            verdict = "fits" if peak is not None and peak <= budget else "over"
            print(f"fit {name}: {world} ranks -> {fmt_bytes(peak or 0)} per rank ({verdict})", file=sys.stderr,
                  flush=True)

        distributed = resolve(job.run, target_device=job.run.device).distributed
        fits.append(smallest_world(job, budget, peak_at, distributed, probe))
    return {"world_fits": [dataclasses.asdict(f) for f in fits], "cannot_see": list(CANNOT_SEE)}


def fit_request(request: dict) -> dict:
    """In the child process of `membench fit` (launch.probe.call_isolated): plan the runs (loading the user's code),
    fit each (request["jobs"] at a time: in_forks), showing every prediction on stderr as the search goes;
    the answer is the fits and their jobs."""
    budget, by, over = request["budget"], request["by"], request.get("over", "batch")
    if by == "world-size":
        return world_request(request)

    def probe(job: Job, peak: int) -> None:  # each prediction takes a second or more: show the search as it goes
        verdict = "fits" if peak <= budget else "over"
        at = f"seq-len {job.run.seq_len}" if over == "seq-len" else f"batch {job.run.batch_size}"
        print(f"fit {job.name}: {at} -> {fmt_bytes(peak)} ({verdict})", file=sys.stderr, flush=True)

    jobs = plan(**request["plan"], in_process=True)
    for job in jobs:  # before any search: a technique no prediction stands for cannot be fitted either
        try:
            check_predictable(resolve(job.run, target_device=job.run.device))
        except CannotPredict as exc:
            raise UserError(f"cannot fit {job.name}: {exc}") from None

    traced = functools.partial(predict_traced, cache=ModelCache())  # every batch tried starts from one meta model

    def fit_one(job: Job) -> Fit:
        return timed_fit(job, _fitted(job), request.get("objective"))

    def _fitted(job: Job) -> Fit:
        if over == "seq-len":
            return longest_sequence(job, budget, by, traced, request["max_batch"], on_probe=probe)
        if by != "device":
            return fit_batch(job, budget, by, traced, request["max_batch"], on_probe=probe)
        # The whole device: reserved memory under the budget less what the rank holds outside the allocator
        outside = outside_allocator(job.run)
        fit = fit_batch(job, budget - outside, "reserved", traced, request["max_batch"],
                        on_probe=lambda j, reserved: probe(j, reserved + outside))
        return dataclasses.replace(fit, peak=None if fit.peak is None else fit.peak + outside,
                                   over_peak=None if fit.over_peak is None else fit.over_peak + outside)

    workers = _workers(request.get("jobs"), len(jobs), "techniques fitted one at a time")
    if workers > 1:
        fits = in_forks(jobs, fit_one, workers, request["plan"].get("workload"), "fitting")
    else:
        fits = [fit_one(job) for job in jobs]
    from membench.predict.gpus import local_gpu_name

    # Asked once the workers are done (naming the GPU starts CUDA's driver, after which a fork could not use CUDA):
    # whether the CLI's process, which never imports torch, may confirm the fits with real runs on this GPU.
    return {"fits": [dataclasses.asdict(f) for f in fits], "jobs": [job.to_dict() for job in jobs],
            "local_gpu": local_gpu_name(), "cannot_see": list(CANNOT_SEE), "target": _target(request["plan"]),
            "arch": _arch(jobs)}


def timed_fit(job: Job, fit: Fit, objective: str | None) -> Fit:
    """fit --objective speed: the fit with its predicted step time at the batch found (one more prediction)."""
    if objective != "speed" or not fit.batch:
        return fit
    time = predict_traced(job.with_run(batch_size=fit.batch)).time
    if time is None:
        return fit
    return dataclasses.replace(fit, step_s=time.step_s, throughput=time.throughput, unit=time.unit)


def fork_refused() -> str | None:
    """Why fit's workers may not be forked from this process, or None. Not once CUDA is initialised, nor once
    autograd has run here (the user's factory may run a backward): the same probe as a sweep's forked runs."""
    import torch

    from membench.launch.fork import why_not_fork

    return why_not_fork("cuda" if torch.cuda.is_initialized() else "cpu")


def in_forks(jobs: list[Job], call, workers: int, workload: str | None, doing: str) -> list:
    """call(job) for every job in `workers` processes forked from this one, the workload already loaded
    (launch.pool: the output in the serial loop's order), the answers in the order of `jobs`. A job that raises is
    the same one line as in the serial loop; a worker that dies is one line naming the job it was `doing`."""

    def answer(k: int):  # in a worker
        try:
            return call(jobs[k])
        except UserError as exc:
            return UserError(str(exc))
        except BaseException as exc:  # noqa: BLE001 - the user's code raising: one line, as serially
            return UserError(failure_line(exc, workload))

    try:
        answers = run_in_order(answer, len(jobs), workers, stops=lambda a: isinstance(a, UserError))
    except WorkerDied as died:
        raise UserError(f"{doing} {jobs[died.index].name} (in a process of its own) {died.how} before answering "
                        "(the workload's code exits or crashes the process?)") from None
    for a in answers:
        if isinstance(a, UserError):
            raise a
    return answers


def _imported(predicting: bool) -> None:
    """The cycle collector on again where this process's start turned it off, before the user's code runs (what it
    makes is collected as usual); predictions' fake tensors need torch._dynamo, imported first. What importing
    made is frozen out of the collector's reach: the later collections, and the forked workers' copies of those
    pages, leave it alone."""
    if gc.isenabled():
        return
    if predicting:
        private.import_fake_tensor_needs()
    gc.freeze()
    gc.enable()


def main(argv: list[str]) -> int:
    lifeline.tie_worker_to_sweep()  # a probe never outlives the sweep that started it
    _imported(predicting=argv[0] == "--call")
    if argv[0] == "--call":  # KIND REQUEST ANSWER; the answer goes to a file
        from membench.common.fsio import atomic_write_text

        os.dup2(2, 1)  # the user's prints never mix with anything membench reads: all of it is output to show
        sys.stdout = sys.stderr
        answer = call_here(argv[1], json.loads(Path(argv[2]).read_text()))
        atomic_write_text(Path(argv[3]), json.dumps(answer))
        return 0
    print(json.dumps(plan_here(json.loads(Path(argv[0]).read_text()))))
    return 0


if __name__ == "__main__":
    lifeline.exit_promptly(main(sys.argv[1:]))
