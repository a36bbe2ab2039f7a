"""Values a prediction reads: known where a run's would be known, else answered as a GPU run would most likely go,
and named.

Fake tensors have shapes but no values, and code reads values back: `loss.item()`, `if t:`, `t.any()`, an
optimizer's `_get_value(step)`, transformers' LayerDrop (`if torch.rand([]) < self.layerdrop: continue`). Each read
reaches the fake-tensor mode as ATen's `_local_scalar_dense` (or `item` under inference mode). Before, every read was
answered 1: `torch.rand([]) < 0.1` came out true, and OPT skipped all of its layers (42-95% low, exit 0).

Now a small tensor (at most SMALL elements) carries the value a run would compute where that is known without the
model's data:
- made from Python data (`torch.tensor(0.0)`, ATen's `lift_fresh`: an optimizer's step count): that value;
- made by a value factory (`torch.zeros(())`, `torch.full`, `arange`): its value;
- a uniform random draw (`torch.rand`, `rand_like`, `uniform_`): three values, the lowest, the median and the highest
  the draw can take;
- made by any op from such tensors and Python numbers, or written in place by one: the op run on the values (each
  of the three for a draw).
A read of a known value answers it. A read of a draw answers the median draw's outcome: for a comparison with a
fixed threshold (LayerDrop's) that is the outcome more likely than not (a layer is kept unless layerdrop > 0.5); it
is named, as certain where the lowest and highest draws agree with it, else as a guess. A read of anything else
(the model's data, on the GPU in a run) answers 1 (True), except GradScaler's inf/nan flag, 0: a step whose gradients
are finite (the steady state; a skipped step allocates less). Both are named. Ops whose output shape depends on
values (nonzero, masked_select, boolean-mask indexing) are refused with where they ran.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from membench import private

SMALL = 16  # elements: scalars, and the few-element tensors code reads back; larger ones are never read back
_ATTR = "_membench_values"  # on a fake tensor: its Known
aten = torch.ops.aten

_FACTORIES = frozenset({aten.zeros.default, aten.ones.default, aten.full.default, aten.scalar_tensor.default,
                        aten.arange.default, aten.arange.start, aten.arange.start_step})
_DRAWS = frozenset({aten.rand.default, aten.rand.generator, aten.rand_like.default, aten.uniform_.default})


class NeedsValues(Exception):
    """The model does what depends on its tensors' values beyond what a prediction can answer."""


@dataclass
class Known:
    """A tensor's value as real tensors: one, or (lowest, median, highest) where it follows from a random draw."""

    values: tuple[torch.Tensor, ...]

    @property
    def drawn(self) -> bool:
        return len(self.values) == 3


class Values:
    """What is known of small tensors' values, and every answer given without knowing (answered())."""

    def __init__(self):
        self.counts: Counter[str] = Counter()  # "site: what was answered" -> how many times
        self._finite_flags = WeakIdKeyDictionary()

    # --- reads ---------------------------------------------------------------------------------------------
    def read(self, tensor: torch.Tensor):
        if not private.is_fake(tensor):  # a real tensor met under the mode: it has its value
            with private.no_dispatch_modes():
                return tensor.item()
        known = getattr(tensor, _ATTR, None)
        if known is None:
            if tensor in self._finite_flags:
                self._answered("GradScaler's inf/nan check answered 0 (none found: the optimizer steps)")
                return 0
            answer = True if tensor.dtype == torch.bool else 1
            self._answered(f"a tensor's value, which a prediction does not have: answered {answer}")
            return answer
        with private.no_dispatch_modes():
            answers = [v.item() for v in known.values]
        if not known.drawn:
            return answers[0]
        median = answers[1]
        if answers[0] == answers[2] == median:
            self._answered(f"a random draw's outcome: {median} for every value the draw can take")
        else:
            other = answers[0] if answers[0] != median else answers[2]
            self._answered(f"a random draw's outcome: answered {median}, the median draw's (other draws give "
                           f"{other})")
        return median

    def finite_check(self, found_inf: torch.Tensor) -> None:
        """GradScaler's check wrote whether a gradient was inf or nan into found_inf."""
        self._finite_flags[found_inf] = True
        _forget(found_inf)

    def _answered(self, what: str) -> None:
        frame = _caller_frame()
        if frame is None or frame.f_code.co_filename != _STEP_FILE:  # membench's step reads the loss for its log
            self.counts[f"{_site(frame)}: {what}"] += 1

    def answered(self) -> list[str]:
        """Each answer given without a known value, once per place and answer, with how often."""
        return [f"{what} ({n}x)" if n > 1 else what for what, n in self.counts.items()]

    # --- what ops make and write ---------------------------------------------------------------------------
    def made(self, func, args, kwargs, out) -> None:
        """After an op: the values of what it made or wrote, where they follow from known values."""
        if not isinstance(out, torch.Tensor) or out.numel() > SMALL:
            return  # a large tensor's value is never read back (and a draw's there is dropout's)
        if func is private.LIFT_FRESH:
            if not private.is_fake(args[0]):
                with private.no_dispatch_modes():  # a real copy, not one FakeTensorMode makes fake
                    setattr(out, _ATTR, Known((args[0].detach().clone(),)))
        elif func in _DRAWS:
            _drawn(func, args, kwargs, out)
        elif func in _FACTORIES or any(_known(t) is not None for t in _tensors((*args, *kwargs.values()))):
            _compute(func, args, kwargs, out)

    def written(self, func, args, kwargs) -> None:
        """An in-place pointwise op (one tensor, or a list of them for foreach) wrote its first argument."""
        targets = args[0] if isinstance(args[0], (list, tuple)) else (args[0],)
        if any(getattr(t, _ATTR, None) is not None for t in targets):
            _compute(func, args, kwargs, None)


def _drawn(func, args, kwargs, out) -> None:
    """A uniform draw in [low, high): its lowest, median and highest values."""
    low, high = 0.0, 1.0
    if func is aten.uniform_.default:
        low = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
        high = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
    with private.no_dispatch_modes():
        shape = tuple(out.shape)
        values = [torch.full(shape, v, dtype=torch.float64).to(out.dtype) for v in (low, (low + high) / 2, high)]
        values[2] = values[2].nextafter(values[0])  # the largest value below high in the draw's dtype
    setattr(out, _ATTR, Known(tuple(values)))


def _known(value) -> Known | None:
    return getattr(value, _ATTR, None) if isinstance(value, torch.Tensor) else None


def _tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _compute(func, args, kwargs, out) -> None:
    """Run func on the known values (on each of a draw's three), and keep the results on what it made or wrote
    (out=None: its first argument, in place); where a tensor argument's value is not known, what it writes is
    forgotten and what it makes has no known value."""
    where = [i for i in private.written_arguments(func) if i < len(args)] if out is None or func._schema.is_mutable \
        else []
    targets = [t for i in where for t in _tensors((args[i],))] or [out]
    tensors = list(_tensors((*args, *kwargs.values())))
    knowns = [_known(t) for t in tensors]
    if any(k is None for k in knowns) or any(t.numel() > SMALL for t in targets):
        for t in targets:
            _forget(t)
        return
    runs = 3 if any(k.drawn for k in knowns) else 1
    by_id = {id(t): k for t, k in zip(tensors, knowns)}
    results = []
    try:
        with private.no_dispatch_modes(), private.exclude_dispatch_keys(private.AUTOCAST_CPU_KEYS):
            for run in range(runs):
                real_args = [_real(a, by_id, run, runs) for a in args]
                real_kwargs = {k: _real(v, by_id, run, runs) for k, v in kwargs.items()}
                result = func(*real_args, **real_kwargs)
                results.append([t for i in where for t in _tensors((real_args[i],))] if where else [result])
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        results = None
    for i, target in enumerate(targets):
        if results is not None and all(isinstance(r[i], torch.Tensor) for r in results):
            setattr(target, _ATTR, Known(tuple(r[i] for r in results)))
        else:
            _forget(target)


def _real(value, by_id: dict, run: int, runs: int):
    """The argument with each known tensor replaced by its value (the run-th of a draw's three); a list (a foreach
    op's) item by item. Known values are private copies an in-place op may write: over three runs, a value that is
    not a draw's is copied for each."""
    if isinstance(value, torch.Tensor):
        known = by_id.get(id(value))
        if known is None:
            return value
        if known.drawn:
            return known.values[run]
        return known.values[0].clone() if runs > 1 else known.values[0]
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, by_id, run, runs) for v in value)
    return value


def _forget(tensor: torch.Tensor) -> None:
    if getattr(tensor, _ATTR, None) is not None:
        setattr(tensor, _ATTR, None)


def caller() -> str:
    """The code that asked (file:line, function): the first frame outside membench's dispatch handlers and torch's
    dispatch machinery."""
    return _site(_caller_frame())


def _caller_frame():
    frame = sys._getframe(1)
    while frame is not None and _machinery(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _site(frame) -> str:
    if frame is None:
        return "(unknown)"
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"


_STEP_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "step.py")
_MACHINERY = tuple(os.path.join(*parts) for parts in (
    ("membench", "predict"), ("membench", "trackers"), ("torch", "utils", "_python_dispatch.py"),
    ("torch", "_subclasses"), ("torch", "_ops.py"), ("torch", "_dynamo", "eval_frame.py"), ("torch", "_compile.py")))


def _machinery(filename: str) -> bool:
    return any(part in filename for part in _MACHINERY)


def _short(filename: str) -> str:
    """A path as a reader finds it: from the package root for installed code, else from the working directory."""
    marker = os.sep + "site-packages" + os.sep
    if marker in filename:
        return filename.split(marker, 1)[1]
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative
