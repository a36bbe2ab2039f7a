"""Each option's default is written once, on its spec field: `membench run` with no options plans the same jobs as
`membench.run_sweep` / `api.plan` with none."""

from __future__ import annotations

from membench.api import plan
from membench.cli import build_parser, run_options


def test_the_cli_and_the_api_plan_the_same_jobs_by_default():
    args = build_parser().parse_args(["run", "--workload", "gpt-tiny", "--batch-size", "8", "--device", "cpu"])
    assert plan("gpt-tiny", None, 8, "cpu", **run_options(args)) == plan("gpt-tiny", None, 8, "cpu")
