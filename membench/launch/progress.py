"""Progress inside a sweep: the worker says which stage of a run it is in; the sweep passes it on as it goes.

The worker appends one JSON line per stage to a file the launcher names in $MEMBENCH_PROGRESS
(<out>/runs/<run>.progress). A file rather than a pipe: what the worker wrote before a crash, an OOM kill or a
timeout stays readable, and the lifecycle polls it while it waits for the worker (lifecycle.run_job), passing
each Stage on; report/live.py shows them.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROGRESS_ENV = "MEMBENCH_PROGRESS"

STAGE_WORDS = {
    "start": "starting Python and torch",
    "build": "building the model",
    "warmup": "warm-up",
    "measure": "measuring memory",
    "timeline": "timeline pass",
    "time": "timing",
    "flops": "counting FLOPs",
    "check": "equivalence check",
}


@dataclass(frozen=True)
class Stage:
    """One stage of one run, as the worker reported it. step/steps: 'timing step 3 of 5' (steps is None past
    --steps, when --min-time keeps timing); elapsed_s: seconds since the run started."""

    run: str
    stage: str
    elapsed_s: float = 0.0
    step: int | None = None
    steps: int | None = None

    def describe(self) -> str:
        words = STAGE_WORDS.get(self.stage, self.stage)
        if self.step is None:
            return words + (f" ({self.steps} step{'s' if self.steps > 1 else ''})" if self.steps else "")
        return f"{words} step {self.step}" + (f" of {self.steps}" if self.steps else " (--min-time)")


# --- the worker's side ------------------------------------------------------------------------------------------

def report(stage: str, step: int | None = None, steps: int | None = None) -> None:
    """Append this stage to $MEMBENCH_PROGRESS; nothing when it is unset (a run in the caller's process, a test).
    Under torchrun only rank 0 reports: the ranks step together."""
    path = os.environ.get(PROGRESS_ENV)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    line = json.dumps({"stage": stage, "t": time.time(), "step": step, "steps": steps})
    try:
        with open(path, "a") as f:  # opened per line: each line is on disk before the next stage starts
            f.write(line + "\n")
    except OSError:
        pass  # progress is a courtesy: a full disk must not fail the measurement


# --- the launcher's side ----------------------------------------------------------------------------------------

class StageReader:
    """Reads the complete lines a worker appended since the last read."""

    def __init__(self, path: Path, run: str, started: float):
        self.path, self.run, self.started, self.offset = Path(path), run, started, 0
        self.path.write_text("")  # a rerun starts an empty file: never an earlier run's stages

    def read(self) -> list[Stage]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        stages = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                d = json.loads(line)
                stages.append(Stage(self.run, str(d["stage"]), max(0.0, float(d["t"]) - self.started),
                                    d.get("step"), d.get("steps")))
            except (ValueError, KeyError, TypeError):
                continue  # not a line of ours: skip it rather than stop the sweep
        return stages
