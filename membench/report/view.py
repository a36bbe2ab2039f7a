"""One sweep's report, computed once: `SweepView`. The terminal (terminal.py), report.md (write.py), report.html
(html.py) and the charts (charts.py) only format it, so no two of them can say different things: the same table
cells, notes, breakdowns, sentences, speed verdicts and recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.vocab import CATEGORIES
from membench.report import explain as ex
from membench.report.noise import Speed, speed
from membench.report.recommend import Goal, Recommendation, recommend
from membench.report.table import BREAKDOWN_HEADERS, breakdown_rows, notes, rows
from membench.report.words import recommendation_lines, story_lines
from membench.results import RunRecord
from membench.results.schema import ModuleBytes
from membench.results.sweep import Sweep


@dataclass(frozen=True)
class RunView:
    """One run as every format shows it. breakdown: bytes by category at the peak, in CATEGORIES' order (None:
    not recorded); speed: against the baseline, as the interleaved timing supports it (None: not timed)."""

    record: RunRecord
    name: str
    status: str
    peak: int | None
    breakdown: tuple[tuple[str, int], ...] | None
    story: tuple[str, ...]
    speed: Speed | None
    top_modules: tuple[ModuleBytes, ...]

    def parts(self) -> dict[str, int] | None:
        return dict(self.breakdown) if self.breakdown is not None else None


@dataclass(frozen=True)
class SweepView:
    """A sweep's report: its title, the table (headers and cells), its notes, the breakdown table, each run, and
    the recommendation with its sentences."""

    sweep: Sweep
    title: str
    heading: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...]
    breakdown_headers: tuple[str, ...]
    breakdown_rows: tuple[tuple[str, ...], ...]
    runs: tuple[RunView, ...]
    recommendation: Recommendation
    advice: tuple[str, ...]

    @property
    def reference(self) -> RunView | None:
        ref = self.sweep.reference
        return next((r for r in self.runs if r.record is ref), None)


def _run(r: RunRecord, reference: RunRecord | None) -> RunView:
    parts = ex.breakdown(r)
    top = r.memory.top_modules if r.memory and r.memory.top_modules else []
    return RunView(record=r, name=r.name, status=r.status, peak=r.peak,
                   breakdown=tuple((c, parts.get(c, 0)) for c in CATEGORIES) if parts else None,
                   story=tuple(story_lines(ex.explain(r, reference))),
                   speed=speed(r) if r.timing is not None else None, top_modules=tuple(top))


def view(sweep: Sweep, goal: Goal = Goal("lowest-peak")) -> SweepView:
    """Everything the report says about `sweep`, decided once."""
    headers, body = rows(sweep)
    rec = recommend(sweep, goal)
    return SweepView(sweep=sweep, title=sweep.title(), heading=sweep.heading(), headers=tuple(headers),
                     rows=tuple(tuple(row) for row in body), notes=tuple(notes(sweep)),
                     breakdown_headers=tuple(BREAKDOWN_HEADERS),
                     breakdown_rows=tuple(tuple(row) for row in breakdown_rows(sweep)),
                     runs=tuple(_run(r, sweep.reference) for r in sweep.runs), recommendation=rec,
                     advice=tuple(recommendation_lines(rec)))
