"""The launcher's probe, in its own process: plan a sweep of a user's workload where importing and calling the
user's factory cannot hang, abort or crash the sweep itself (launcher.probe starts it and waits).

Run as `python -m membench.plan_probe PLAN_ARGS.json`: the arguments of `api.plan` in, one line of JSON out,
{"jobs": [...]} or {"error": "one line"}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from membench import lifeline
from membench.api import plan
from membench.errors import UserError


def plan_here(args: dict) -> dict:
    """The jobs of the sweep `args` describe, planned in this process, or why not."""
    try:
        return {"jobs": [job.to_dict() for job in plan(**args, in_process=True)]}
    except UserError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the user's factory raising: its message is the answer
        return {"error": f"workload {args.get('workload')!r} raised {type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> int:
    lifeline.tie_worker_to_sweep()  # a probe never outlives the sweep that started it
    print(json.dumps(plan_here(json.loads(Path(argv[0]).read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
