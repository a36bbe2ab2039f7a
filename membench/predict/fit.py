"""The largest batch that fits a memory budget, per technique: found from predictions, confirmed on a GPU.

From a few traces (fit_batch): a training step makes the same allocations in the same order at every batch size,
with sizes affine in the batch, for most models. That is checked, not assumed: two predictions (at two and three
batch steps; one is often special, as a transpose of one sample is already contiguous and copies nothing; where two
and three differ, three and four are tried) must make the same allocations and frees in the same order, every size
is derived as a + c x batch, and the search then runs on the derived allocations alone (peak allocated is a sum;
reserved memory comes from the caching allocator simulator, a fraction of a second per batch). CUDA kernel scratch
(a reduction's staging buffers, taken only past some size) is not affine: it is worked out again at each batch
from its calls' tensor layouts, which are. The answer and the first batch over are then predicted for real and must
match the derived allocations event for event; where anything differs (data-dependent shapes, a kernel choice that
changes with the size) the full search runs instead, and says so.

The full search (largest_batch) predicts every batch it tries: exponential (1, 2, 4, ... until one does not fit)
then binary. Where a CUDA GPU is present, the predicted batch is then run for real in a subprocess under the budget;
an OOM there is a data point (the prediction was optimistic: step down), a success is tried one step further up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from membench.common.errors import UserError, failure_line
from membench.predict import gpus
from membench.predict.emulate.reductions import KernelScratch
from membench.predict.run import Traced
from membench.predict.verdict import Fit
from membench.spec import Job
from membench.techniques import resolve
from membench.workloads import load_workload


def batch_step(job: Job) -> int:
    """The smallest batch every technique of the stack accepts; all multiples of it are accepted too."""
    workload = load_workload(job.run.workload, job.run.seq_len)
    for b in range(1, 4097):
        trial = dataclasses.replace(job.run, batch_size=b)
        try:
            resolve(trial, target_device=job.run.device).validate(trial, workload)
        except UserError:
            continue
        return b
    raise UserError(f"no batch size up to 4096 is valid for {job.name}")


def largest_batch(job: Job, budget: int, peak: Callable[[Job], int], max_batch: int = 65536) -> Fit:
    """Exponential then binary search over multiples of batch_step(job) for the largest peak(job) <= budget."""
    step = batch_step(job)
    seen: dict[int, int] = {}

    def at(k: int) -> int:
        if k not in seen:
            seen[k] = peak(job.with_run(batch_size=k * step))
        return seen[k]

    if at(1) > budget:
        return Fit(job.name, 0, None, step, step, seen[1], len(seen), note="even the smallest batch is over budget")
    lo, hi = 1, 2
    while hi * step <= max_batch and at(hi) <= budget:
        lo, hi = hi, hi * 2
    if hi * step > max_batch:
        return Fit(job.name, lo * step, at(lo), step, None, None, len(seen), note=f"--max-batch {max_batch} fits")
    while hi - lo > 1:  # at(lo) fits, at(hi) does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= budget else (lo, mid)
    return Fit(job.name, lo * step, at(lo), step, hi * step, at(hi), len(seen))


def confirm_on_gpu(job: Job, fit: Fit, budget: int, out_dir: Path, tries: int = 4) -> Fit:
    """Run the predicted batch on the GPU under the budget (a memory fraction), each in its own process; walk
    down on OOM, up on success, at most `tries` runs. Not exercised on CPU-only machines: no GPU, no confirmation.
    """
    from membench.launch.process import launch

    def fits(batch: int) -> bool | None:
        run = job.with_run(device="cuda", batch_size=batch, memory_budget=budget).with_measure(
            check=False, steps=2, warmup=1, timeline=False)
        status = launch(run, out_dir / f"{job.name}-bs{batch}").status
        return {"ok": True, "oom": False}.get(status)  # None: it failed for another reason

    batch, step = max(fit.batch, fit.step), fit.step
    ok = fits(batch)
    runs, best = 1, (batch if ok else None)
    direction = step if ok else -step
    while ok is not None and runs < tries:
        batch += direction
        if batch <= 0:
            break
        ok = fits(batch)
        runs += 1
        if ok:
            best = max(best or 0, batch)
        if (direction > 0 and not ok) or (direction < 0 and ok):
            break
    fit.confirmed = best if best is not None else 0
    if ok is None:
        fit.note = (fit.note + "; " if fit.note else "") + f"a confirmation run failed (see {out_dir})"
    return fit


def default_jobs() -> int:
    """The cores this process may run on (its affinity, where the OS tells it): one technique on each."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fork_refused() -> str | None:
    """Why fit's workers may not be forked from this process, or None. Not once CUDA is initialised, nor once
    autograd has run here (the user's factory may run a backward): the same probe as a sweep's forked runs."""
    import torch

    from membench.launch.fork import why_not_fork

    return why_not_fork("cuda" if torch.cuda.is_initialized() else "cpu")


def fit_in_parallel(jobs: list[Job], fit_one: Callable[[Job], Fit], workers: int, workload: str | None) -> list[Fit]:
    """fit_one(job) for every job in `workers` processes forked from this one (the workload already loaded), worker
    w taking jobs w, w + workers, ... in turn (a worker's first prediction pays for torch's dispatch caches, which
    its later ones reuse: one process per job would pay it for every job); the fits in the order of `jobs`.

    Each job's output (the search's progress lines, the user's prints) goes through a pipe of its own to this
    process, which shows it in the order the serial loop would: the first unfinished job's as it comes, the
    others' once every job before them has finished. Its answer comes back as one line of JSON on another pipe. A
    job that raises is the same one line as in the serial loop; a worker that dies is one line naming the
    technique it was fitting; either way the other workers are killed first. Workers stay in this process's
    group and session, so the command's --timeout and its end kill them with everything else.
    """
    from membench.launch.lifeline import die_with_parent

    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()  # what is buffered here would otherwise be written again by every worker
    pipes = [(os.pipe(), os.pipe()) for _ in jobs]  # per job: (output read, write), (answer read, write)
    state = [{"out": bytearray(), "answer": bytearray()} for _ in jobs]
    held = {fd for pair in pipes for ends in pair for fd in ends}  # this process's ends not yet closed

    def close(fd: int) -> None:
        os.close(fd)
        held.discard(fd)

    def work(mine: list[int]) -> None:  # in the worker; never returns
        code = 1
        try:
            die_with_parent(parent)  # the kernel's PDEATHSIG is not inherited across fork
            for k, ((out_r, out_w), (ans_r, ans_w)) in enumerate(pipes):
                os.close(out_r)
                os.close(ans_r)
                if k not in mine:
                    os.close(out_w)
                    os.close(ans_w)
            for k in mine:
                (_, out_w), (_, ans_w) = pipes[k]
                os.dup2(out_w, 1)
                os.dup2(out_w, 2)
                os.close(out_w)
                try:
                    answer = {"fit": dataclasses.asdict(fit_one(jobs[k]))}
                except UserError as exc:
                    answer = {"error": str(exc)}
                except BaseException as exc:  # noqa: BLE001 - the user's code raising: one line, as serially
                    answer = {"error": failure_line(exc, workload)}
                sys.stdout.flush()
                sys.stderr.flush()
                data = (json.dumps(answer) + "\n").encode()
                while data:
                    data = data[os.write(ans_w, data):]
                os.close(ans_w)
                if "error" in answer:
                    break  # the serial loop stops at the first error too
            code = 0
        finally:
            os._exit(code)

    running: dict[int, list[int]] = {}  # pid: its jobs
    owner: dict[int, int] = {}  # job: its worker's pid
    dead: dict[int, int] = {}  # workers that ended: their wait status
    try:
        for w in range(workers):
            mine = list(range(w, len(jobs), workers))
            pid = os.fork()
            if pid == 0:
                work(mine)
            running[pid] = mine
            owner.update((k, pid) for k in mine)
        fds: dict[int, tuple[int, str]] = {}
        for k, ((out_r, out_w), (ans_r, ans_w)) in enumerate(pipes):
            close(out_w)
            close(ans_w)
            for fd, what in ((out_r, "out"), (ans_r, "answer")):
                os.set_blocking(fd, False)
                fds[fd] = (k, what)

        def read(fd: int) -> None:
            k, what = fds[fd]
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    return
                if not chunk:  # EOF
                    close(fd)
                    del fds[fd]
                    return
                state[k][what] += chunk

        def answered(k: int) -> bool:
            return state[k]["answer"].endswith(b"\n")

        shown = 0
        while shown < len(jobs):
            ready = select.select(list(fds), [], [], 0.5)[0] if fds else time.sleep(0.5) or []
            for fd in ready:
                read(fd)
            for pid in list(running):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    # What it wrote before exiting; a process it forked may hold the pipes open: read what is
                    # there, never wait for their EOF.
                    for fd in [fd for fd, (k, _) in fds.items() if k in running[pid]]:
                        if fd in fds:
                            read(fd)
                    dead[pid] = status
                    del running[pid]
            while shown < len(jobs):  # the first unfinished job's output, as the serial loop shows it
                if state[shown]["out"]:
                    os.write(1, bytes(state[shown]["out"]))  # fd 1 and 2 are one stream in the fitting process
                    state[shown]["out"].clear()
                if not answered(shown) and owner[shown] not in dead:
                    break
                _raise_for(jobs[shown], state[shown]["answer"], dead.get(owner[shown]))
                shown += 1
    finally:
        for pid in running:  # an error or an interrupt: no worker outlives the fit
            os.kill(pid, signal.SIGKILL)
        for pid in running:
            os.waitpid(pid, 0)
        for fd in list(held):
            close(fd)
    return [Fit(**json.loads(state[k]["answer"])["fit"]) for k in range(len(jobs))]


def _raise_for(job: Job, answer: bytes, status: int | None) -> None:
    """The serial loop's error for a job that raised; one line naming the technique for a worker that died."""
    try:
        answer = json.loads(answer)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "fit" in answer:
        return
    if isinstance(answer, dict) and answer.get("error"):
        raise UserError(str(answer["error"]))
    how = ("ended" if status is None else f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
           else f"exited with code {os.waitstatus_to_exitcode(status)}")
    raise UserError(f"fitting {job.name} (in a process of its own) {how} before answering (the workload's code "
                    "exits or crashes the process?)")


class AffineTrace:
    """The allocations of a prediction at any batch, derived from two: event i is the same allocation or free at
    every batch, and an allocation's size is a + c x batch (bytes, integers). Kernel scratch (a CUDA kernel's own
    buffers, predict/emulate/reductions.py) is not affine in the batch: a reduction splits across blocks only past
    some size, with buffers sized by the GPU. Its calls are kept apart, each with its tensors' layouts (affine in
    the batch), and their scratch is worked out again at each batch by the same code a prediction runs."""

    def __init__(self, kinds: list[tuple], sizes: list[tuple[int, int] | None], measured_from: int, round_to: int,
                 settings, calls: list[tuple] = (), scratch=None):
        self.kinds, self.sizes, self.measured_from = kinds, sizes, measured_from  # measured_from: among kinds
        self.round_to, self.settings = round_to, settings
        self.calls, self.scratch = list(calls), scratch  # (index among kinds, KernelCall, affine layout)
        self.first, self.step = 0, 1

    @classmethod
    def derive(cls, a: Traced, batch_a: int, b: Traced, batch_b: int, settings, scratch=None) -> AffineTrace | str:
        """The affine trace through a and b, or why there is none (in words). scratch: the prediction's
        predict/emulate/reductions.KernelScratch (its GPU), for traces that kept kernel calls."""
        (events_a, calls_a, from_a), (events_b, calls_b, from_b) = _apart(a), _apart(b)
        if len(events_a) != len(events_b) or from_a != from_b:
            return (f"batch {batch_a} makes {len(events_a)} allocations and frees, batch {batch_b} makes "
                    f"{len(events_b)}")
        kinds, sizes = [], []
        for i, (x, y) in enumerate(zip(events_a, events_b)):
            if x[:2] != y[:2]:
                return f"event {i} differs between batch {batch_a} and batch {batch_b}: {x[:2]} vs {y[:2]}"
            kinds.append(x[:2])
            if x[0] != "alloc":
                sizes.append(None)
                continue
            slope, rest = divmod(y[2] - x[2], batch_b - batch_a)
            if rest or slope < 0:
                return f"allocation {i} grows from {x[2]} B to {y[2]} B: not a whole number of bytes per sample"
            sizes.append((x[2] - slope * batch_a, slope))
        if len(calls_a) != len(calls_b):
            return f"batch {batch_a} makes {len(calls_a)} kernel calls, batch {batch_b} makes {len(calls_b)}"
        calls = []
        for (at_a, call_a), (at_b, call_b) in zip(calls_a, calls_b):
            layout = _affine(call_a.layout, call_b.layout)
            if at_a != at_b or call_a.func is not call_b.func or layout is None or scratch is None:
                return f"a kernel call at event {at_a} is not the same op on affine layouts at both batches"
            calls.append((at_a, call_a, layout))
        model = cls(kinds, sizes, from_a, a.round_to, settings, calls, scratch)
        model.first, model.step = batch_a, batch_b - batch_a  # the calls' layouts: per step from the first batch
        for traced, batch in ((a, batch_a), (b, batch_b)):
            if model.peak_allocated(batch) != traced.memory.peak_allocated_bytes:
                return "the trace does not account for the predicted peak"  # a tracker change fit must follow
        return model

    def events(self, batch: int) -> tuple[list[tuple], int]:
        """The allocations and frees at `batch`, and where the measured step begins among them."""
        out: list[tuple] = []
        calls = iter(self.calls)
        call = next(calls, None)
        measured_from = None
        for i, (kind, size) in enumerate(zip([*self.kinds, None], [*self.sizes, None])):
            while call is not None and call[0] == i:
                steps, rest = divmod(batch - self.first, self.step)
                if rest:
                    raise ValueError(f"batch {batch} is not a whole number of steps of {self.step} from {self.first}")
                layout = _at(call[2], steps)
                out += [(e[0], ("scratch", id(call), e[1]), *e[2:]) for e in self.scratch.events_of(call[1], layout)]
                call = next(calls, None)
            if i == self.measured_from:
                measured_from = len(out)
            if kind is not None:
                out.append(kind if size is None else (*kind, size[0] + size[1] * batch))
        return out, measured_from

    def matches(self, traced: Traced, batch: int) -> str | None:
        """None when a real prediction at `batch` made exactly the derived allocations; else the first difference."""
        derived, measured_from = self.events(batch)
        events, real = _keys_in_order(derived), _keys_in_order(traced.events)
        if len(events) != len(real) or traced.measured_from != measured_from:
            return f"batch {batch} makes {len(real)} allocations and frees, not {len(events)}"
        for i, (x, y) in enumerate(zip(events, real)):
            if x != y:
                return f"event {i} at batch {batch} is {y}, derived {x}"
        return None

    def peak_allocated(self, batch: int) -> int:
        """The measured step's peak of the sum of live allocations rounded to blocks, as the tracker counts it."""
        r = self.round_to
        events, measured_from = self.events(batch)
        live: dict = {}
        current = peak = 0
        for i, event in enumerate(events):
            if i == measured_from:
                peak = current
            if event[0] == "free":
                current -= live.pop(event[1])
            else:
                rounded = -(-event[2] // r) * r
                live[event[1]] = rounded
                current += rounded
                if i >= measured_from and current > peak:
                    peak = current
        return peak

    def peak_reserved(self, batch: int) -> int:
        from membench.allocator import simulate

        return simulate(self.events(batch)[0], self.settings).peak_reserved_bytes


def _apart(traced: Traced) -> tuple[list[tuple], list[tuple], int]:
    """A trace's events without kernel scratch, keys numbered in order of first use (scratch takes keys from the
    same counter), its kernel calls (each with its place among those events), and the measured step's place."""
    scratch_at = {i for call in traced.kernel_calls for i in range(call.at, call.at + call.count)}
    kept = [i for i in range(len(traced.events)) if i not in scratch_at]
    place = {index: n for n, index in enumerate(kept)}
    place[len(traced.events)] = len(kept)

    def placed(index: int) -> int:  # the first kept event at or after index
        while index not in place:
            index += 1
        return place[index]

    events = _keys_in_order([traced.events[i] for i in kept])
    calls = [(placed(call.at), call) for call in traced.kernel_calls]
    return events, calls, placed(traced.measured_from)


def _keys_in_order(events: list[tuple]) -> list[tuple]:
    numbers: dict = {}
    return [(e[0], numbers.setdefault(e[1], len(numbers)), *e[2:]) for e in events]


def _affine(x, y):
    """x and y (a layout at two batches, one batch step apart) as one layout whose integers are (x, y - x): x plus
    that per batch step (accumulation's micro-batch grows by one sample per step of accum-steps samples)."""
    if type(x) is int and type(y) is int:
        return ("affine", x, y - x)
    if isinstance(x, tuple) and isinstance(y, tuple):
        if len(x) != len(y):
            return None
        parts = tuple(_affine(p, q) for p, q in zip(x, y))
        return None if any(p is None for p in parts) else ("parts", parts)
    return ("same", x) if x == y and type(x) is type(y) else None


def _at(layout, steps: int):
    """The layout `steps` batch steps past the first of the two it was derived from."""
    kind = layout[0]
    if kind == "affine":
        return layout[1] + layout[2] * steps
    if kind == "parts":
        return tuple(_at(p, steps) for p in layout[1])
    return layout[1]


BELOW_CHECKED = 8  # batches below the answer simulated to say whether smaller ones fail (reserved memory)
SCAN_LIMIT = 64  # batches simulated downwards from the allocated-memory bound before bisecting instead


def fit_batch(job: Job, budget: int, by: str, traced: Callable[[Job], Traced], max_batch: int = 65536,
              on_probe: Callable[[Job, int], None] | None = None) -> Fit:
    """The largest batch whose predicted peak `by` ("allocated" or "reserved") fits the budget, from two traces,
    confirmed by real predictions at the answer and the first batch over (see the module docstring); the full
    search where the traces do not allow it. traced(job) is one prediction (predict.predict_traced)."""
    from membench.predict.run import allocator_settings

    step = batch_step(job)
    kmax = max_batch // step
    key = f"peak_{by}_bytes"
    seen: dict[int, Traced] = {}

    def real(k: int) -> Traced:
        if k not in seen:
            trial = job.with_run(batch_size=k * step)
            seen[k] = traced(trial)
            if on_probe:
                on_probe(trial, getattr(seen[k].memory, key))
        return seen[k]

    def value(k: int) -> int:
        return getattr(real(k).memory, key)

    def full_search(why: str) -> Fit:
        fit = largest_batch(job, budget, lambda j: value(j.run.batch_size // step), max_batch)
        fit.note = "; ".join(n for n in (f"{why}: full search", fit.note) if n)
        fit.probes = len(seen)
        return fit

    if kmax < 1:
        raise UserError(f"--max-batch {max_batch} is below the smallest batch {job.name} takes ({step})")

    def smallest() -> Fit:  # one step is special (a transpose of one sample is contiguous: fewer copies)
        if value(1) > budget:
            return Fit(job.name, 0, None, step, step, value(1), len(seen), note="even the smallest batch is over "
                       "budget", method="one prediction")
        over = (2 * step, value(2)) if kmax >= 2 else (None, None)
        return Fit(job.name, step, value(1), step, *over, len(seen), method="predictions at the smallest batches",
                   note="" if kmax >= 2 else f"--max-batch {max_batch} fits")

    if kmax < 3 or value(2) > budget:
        return smallest()
    settings = allocator_settings(resolve(job.run))
    first = 2  # the smallest batch the derived allocations hold for
    scratch = KernelScratch(gpus.gpu(job.run.gpu)) if job.run.device == "cuda" else None
    model = AffineTrace.derive(real(2), 2 * step, real(3), 3 * step, settings, scratch)
    if isinstance(model, str) and kmax >= 4 and value(3) <= budget:
        # Two batch steps can be special too (a size-2 dimension another kernel path takes): one pair further.
        first, why = 3, model
        model = AffineTrace.derive(real(3), 3 * step, real(4), 4 * step, settings, scratch)
        if isinstance(model, str):
            model = f"{why}; {model}"
    if isinstance(model, str):
        return full_search(f"allocations differ between batch sizes ({model})")
    sims = 0

    def fits(k: int) -> bool:
        nonlocal sims
        if by == "allocated":
            return model.peak_allocated(k * step) <= budget
        sims += 1
        return model.peak_reserved(k * step) <= budget

    # Allocated memory only grows with the batch (every size has a slope >= 0): bisect it for an upper bound.
    lo, hi = first, kmax + 1  # lo fits, hi does not (kmax + 1: beyond the search)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if model.peak_allocated(mid * step) <= budget else (lo, mid)
    note = ""
    if by == "reserved":
        # Reserved memory is not monotonic in the batch (segment sizes): walk down from the bound to the largest
        # batch that fits, rather than trust a bisection's luck; bisect only past SCAN_LIMIT batches.
        top = lo
        while lo > first and not fits(lo) and top - lo < SCAN_LIMIT:
            lo -= 1
        if lo > first and not fits(lo):
            low, high = first, lo
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if fits(mid) else (low, mid)
            lo, note = low, f"reserved memory bisected below batch {(top - SCAN_LIMIT) * step}"
    answer = lo
    fails_below = [k * step for k in range(answer - 1, max(answer - 1 - BELOW_CHECKED, first - 1), -1)
                   if by == "reserved" and not fits(k)]
    for k in (answer, answer + 1):
        if k <= kmax and (why := model.matches(real(k), k * step)):
            return full_search(f"derived allocations differ from a real prediction ({why})")
    if value(answer) > budget or (answer < kmax and value(answer + 1) <= budget):
        return full_search("the derived peaks differ from real predictions")
    fit = Fit(job.name, answer * step, value(answer), step, None, None, len(seen), simulations=sims,
              method=f"from traces at {first * step} and {(first + 1) * step}, confirmed at the answer and the batch "
                     "above",
              fails_below=sorted(fails_below))
    if answer < kmax:
        fit.over_batch, fit.over_peak = (answer + 1) * step, value(answer + 1)
    else:
        note = f"--max-batch {max_batch} fits"
    if fails_below:
        listed = ", ".join(map(str, fit.fails_below))
        note = "; ".join(n for n in (note, f"smaller batches {listed} do not fit (reserved memory is not monotonic "
                                            f"in the batch; {BELOW_CHECKED} batches below checked)") if n)
    fit.note = note
    return fit
