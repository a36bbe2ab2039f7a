"""Compact, categorised memory timelines: what was alive, by category, at every allocation and free.

The storage tracker records one event per allocation or free (hundreds of thousands on a real model). A timeline
file keeps at most MAX_POINTS of them: per bucket of consecutive events the lowest and the highest, so the chart
keeps its shape, and the peak event itself, so the timeline's peak equals the tracker's peak to the byte.
The x axis is a step scale (step k spans [k, k+1), events spread evenly inside it), so a baseline and a
technique line up step for step whatever their number of allocations.
"""

from __future__ import annotations

from pathlib import Path

from membench.common.fsio import atomic_write_text
from membench.common.vocab import CATEGORIES
from membench.results import ModuleBytes
from membench.results.timeline import FORMAT_VERSION, Span, Timeline, TimelinePeak, read_timeline
from membench.trackers.storage import StorageTracker

MAX_POINTS = 2000
TIMELINE_STEPS = 2  # recorded steps: the second shows the steady state, the first what changes across steps


def _step_scale(steps: list[int]) -> list[float]:
    first = steps[0]
    counts: dict[int, int] = {}
    for s in steps:
        counts[s] = counts.get(s, 0) + 1
    seen: dict[int, int] = {}
    xs = []
    for s in steps:
        k = seen.get(s, 0)
        seen[s] = k + 1
        xs.append(round(s - first + k / counts[s], 6))
    return xs


def _keep(totals: list[int], max_points: int) -> list[int]:
    """Indices to keep: all of them if few, else the min and max of each bucket (the first max: the peak)."""
    n = len(totals)
    if n <= max_points:
        return list(range(n))
    size = -(-n // (max_points // 2))
    kept = []
    for start in range(0, n, size):
        bucket = range(start, min(n, start + size))
        lo = min(bucket, key=totals.__getitem__)
        hi = max(bucket, key=totals.__getitem__)
        kept.extend(sorted({lo, hi}))
    return kept


def _spans(events, xs: list[float]) -> list[dict]:
    """Consecutive runs of (step, phase): the phase markers of the chart."""
    spans: list[dict] = []
    for (phase, step, _), x in zip(events, xs):
        if spans and spans[-1]["phase"] == phase and spans[-1]["_step"] == step:
            spans[-1]["end"] = x
        else:
            spans.append({"phase": phase, "_step": step, "step": int(x), "start": x, "end": x})
    for s in spans:
        del s["_step"]
    # Frees between two phases (a `del`, the loss total) happen outside any phase: glue, not a phase to mark.
    return [s for s in spans if s["phase"] != "setup"]


def compact(events: list[tuple[str, int, tuple[int, ...]]], max_points: int = MAX_POINTS,
            round_to: int = 1, modules: list[str] | None = None) -> Timeline:
    """The timeline file's content from the tracker's events (phase, step, bytes per category) and, when given,
    the module running at each event (kept as an index into the file's `modules` list, for the report's hover)."""
    if not events:
        raise ValueError("no memory events were recorded")
    totals = [sum(b) for _, _, b in events]
    xs = _step_scale([s for _, s, _ in events])
    peak = max(range(len(totals)), key=totals.__getitem__)
    kept = _keep(totals, max_points)
    phases = list(dict.fromkeys(p for p, _, _ in events))  # in order of first appearance
    phase_index = {p: i for i, p in enumerate(phases)}
    phase, step, breakdown = events[peak]
    names = index = None
    if modules is not None:
        names = list(dict.fromkeys(modules[i] for i in kept))
        index = {m: i for i, m in enumerate(names)}
    return Timeline(
        version=FORMAT_VERSION, categories=list(CATEGORIES), phases=phases, round_to=round_to, events=len(events),
        steps=int(xs[-1]) + 1, x=[xs[i] for i in kept], phase=[phase_index[events[i][0]] for i in kept],
        bytes={c: [events[i][2][j] for i in kept] for j, c in enumerate(CATEGORIES)},
        spans=[Span(**s) for s in _spans(events, xs)],
        peak=TimelinePeak(bytes=totals[peak], x=xs[peak], phase=phase, step=int(xs[peak]),
                          breakdown=dict(zip(CATEGORIES, breakdown))),
        modules=names, module=None if index is None else [index[modules[i]] for i in kept])


def write(path: Path, timeline: Timeline) -> int:
    """Returns the file size in bytes."""
    return atomic_write_text(path, timeline.to_json())


def load(path: Path) -> Timeline:
    return read_timeline(path)


class Recording:
    """One recording pass: the tracker that saw it, and what else was saved (a CUDA snapshot)."""

    def __init__(self, tracker: StorageTracker):
        self.tracker = tracker
        self.files: dict = {}

    def save(self, stem: Path) -> dict:
        """Write `<stem>.timeline.json`; returns what the result JSON says about it (names relative to it)."""
        t = self.tracker
        timeline = compact(t.events, round_to=t.round_to, modules=t.event_modules)
        path = stem.parent / f"{stem.name}.timeline.json"
        size = write(path, timeline)
        return {"file": path.name, "file_bytes": size, "events": timeline.events, "points": len(timeline.x),
                "steps": timeline.steps, "round_to": timeline.round_to,
                "peak_bytes": timeline.peak.bytes, "peak_phase": timeline.peak.phase,
                "peak_step": timeline.peak.step, "breakdown_at_peak": timeline.peak.breakdown,
                "top_modules": [ModuleBytes(module=m, category=c, bytes=b) for m, c, b in t.top_modules()],
                **self.files}
