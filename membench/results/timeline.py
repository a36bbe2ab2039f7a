"""The timeline file (`<run>.timeline.json`): live tensor bytes by category over the recording pass's steps.

Written by trackers/timeline.compact; read back by one typed reader (`parse_timeline`, `read_timeline`): every
field's type checked, then the columns against each other (one value per point, indices in range), a malformed
file one UserError naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from membench.common.errors import UserError
from membench.common.typedjson import build_checked, to_plain
from membench.common.vocab import CATEGORIES

FORMAT_VERSION = 1
MAX_STEPS = 10_000  # far beyond the few steps a recording pass records: a file claiming more is not ours


@dataclass
class Span:
    """A phase of one step, on the step scale."""

    phase: str
    step: int
    start: float
    end: float


@dataclass
class TimelinePeak:
    bytes: int
    x: float
    phase: str
    step: int  # the recording pass's step, from 0
    breakdown: dict[str, int]  # bytes by category at the peak


@dataclass
class Timeline:
    version: int
    categories: list[str]
    phases: list[str]  # in order of first appearance
    round_to: int  # bytes each storage was rounded up to (1: exact CPU sizes; 512: CUDA's blocks)
    events: int  # events the tracker recorded; `x` keeps at most MAX_POINTS of them
    steps: int
    x: list[float]  # each kept point on the step scale (step k spans [k, k+1))
    phase: list[int]  # each point's phase, an index into `phases`
    bytes: dict[str, list[int]]  # by category, live bytes at each point
    spans: list[Span]
    peak: TimelinePeak
    modules: list[str] | None = None  # module names, when the tracker knew them
    module: list[int] | None = None  # each point's module, an index into `modules`

    def totals(self) -> list[int]:
        return [sum(col) for col in zip(*self.bytes.values())]

    def to_json(self) -> str:
        """Without indentation: data for charts, not for reading."""
        return json.dumps(to_plain(self), separators=(",", ":"))


def parse_timeline(text: str, where: str) -> Timeline:
    """A timeline from the text of its file; `where` names the file in the one-line error."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise UserError(f"{where}: not a membench timeline (not JSON)") from None
    if not isinstance(data, dict):
        raise UserError(f"{where}: not a membench timeline (expected a JSON object)")
    t = build_checked(Timeline, data, where)
    n = len(t.x)

    def bad(field: str, must: str):
        return UserError(f"{where}: field {field} must be {must}")

    if not 0 < t.steps <= MAX_STEPS:
        raise bad("steps", f"from 1 to {MAX_STEPS}, got {t.steps}")
    for name, column in t.bytes.items():
        if len(column) != n:
            raise bad(f"bytes.{name}", f"one value per point ({n}), got {len(column)}")
    if len(t.phase) != n:
        raise bad("phase", f"one value per point ({n}), got {len(t.phase)}")
    if any(not 0 <= i < len(t.phases) for i in t.phase):
        raise bad("phase", f"indices into phases (0 to {len(t.phases) - 1})")
    if t.module is not None:
        if t.modules is None or len(t.module) != n or any(not 0 <= i < len(t.modules) for i in t.module):
            raise bad("module", f"one index into modules per point ({n})")
    for c in CATEGORIES:  # a timeline from before a category existed: none of it then
        t.bytes.setdefault(c, [0] * n)
    return t


def read_timeline(path: Path) -> Timeline:
    return parse_timeline(Path(path).read_text(), str(path))
