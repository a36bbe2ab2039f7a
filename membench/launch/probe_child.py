"""The probes' child side, in their own process, where importing and calling the user's code cannot hang, abort or
crash the sweep itself (the launcher starts them and waits):

- `python -m membench.launch.probe_child PLAN_ARGS.json` (probe.probe): the arguments of `api.plan` in, one line of JSON
  out, {"jobs": [...]} or {"error": "one line"}.
- `python -m membench.launch.probe_child --call KIND REQUEST.json ANSWER.json` (probe.call_isolated): predict or
  fit, from loading the user's code to the answer, written to a file (the user's prints never mix with it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from membench.api import plan
from membench.errors import UserError, failure_line
from membench.launch import lifeline


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
    from membench import fit, predict

    try:
        return {"predict": predict.answer_request, "fit": fit.answer_request}[kind](request)
    except UserError as exc:
        return {"error": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - the user's code raising, or SystemExit from it: one line
        return {"error": failure_line(exc, request.get("workload") or request.get("plan", {}).get("workload"))}


def main(argv: list[str]) -> int:
    lifeline.tie_worker_to_sweep()  # a probe never outlives the sweep that started it
    if argv[0] == "--call":  # KIND REQUEST ANSWER; the answer goes to a file
        from membench.fsio import atomic_write_text

        os.dup2(2, 1)  # the user's prints never mix with anything membench reads: all of it is output to show
        sys.stdout = sys.stderr
        answer = call_here(argv[1], json.loads(Path(argv[2]).read_text()))
        atomic_write_text(Path(argv[3]), json.dumps(answer))
        return 0
    print(json.dumps(plan_here(json.loads(Path(argv[0]).read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
