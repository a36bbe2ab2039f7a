"""Progress inside a sweep: the worker says which stage of a run it is in; the sweep passes it on as it goes.

The worker appends one JSON line per stage to a file the launcher names in $MEMBENCH_PROGRESS
(<out>/runs/<run>.progress). A file rather than a pipe: what the worker wrote before a crash, an OOM kill or a
timeout stays readable, and the lifecycle polls it while it waits for the worker (lifecycle.run_job), passing
each Stage on; report/live.py shows them. Each stage is also a line of the run's log (the worker's stderr), with
the time of day and the worker's peak resident memory so far: a long CPU run's log says where it is and what it
holds, rather than staying silent for minutes.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from membench.common.units import fmt_bytes
from membench.results.progress import Stage

PROGRESS_ENV = "MEMBENCH_PROGRESS"

# --- the worker's side ------------------------------------------------------------------------------------------

def report(stage: str, step: int | None = None, steps: int | None = None, model_bytes: int | None = None) -> None:
    """Append this stage to $MEMBENCH_PROGRESS; nothing when it is unset (a run in the caller's process, a test).
    Under torchrun only rank 0 reports: the ranks step together. model_bytes: the built model's parameters."""
    path = os.environ.get(PROGRESS_ENV)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    rss = peak_rss_bytes()
    line = json.dumps({"stage": stage, "t": time.time(), "step": step, "steps": steps, "rss": rss,
                       **({"model": model_bytes} if model_bytes is not None else {})})
    try:
        with open(path, "a") as f:  # opened per line: each line is on disk before the next stage starts
            f.write(line + "\n")
        print(log_line(stage, step, steps, rss=rss), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # progress is a courtesy: a full disk (or a closed stderr) must not fail the measurement


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (getrusage's ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def log_line(stage: str, step: int | None = None, steps: int | None = None, now: float | None = None,
             rss: int | None = None) -> str:
    """'membench 10:46:12: timing step 3 of 5 (peak RSS 1.21 GiB)', the log's line for a stage (local time)."""
    words = Stage("", stage, step=step, steps=steps).describe()
    held = f" (peak RSS {fmt_bytes(rss)})" if rss else ""
    return f"membench {time.strftime('%H:%M:%S', time.localtime(now))}: {words}{held}"


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
                                    d.get("step"), d.get("steps"), d.get("rss"), d.get("model")))
            except (ValueError, KeyError, TypeError):
                continue  # not a line of ours: skip it rather than stop the sweep
        return stages
