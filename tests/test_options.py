"""Each option's default is written once, on its spec field: `membench run` with no options plans the same jobs as
`membench.run_sweep` / `api.plan` with none. Each option's bound and message too, in `spec.CHECKS`: the CLI and the
API refuse the same bad value with the same line."""

from __future__ import annotations

import pytest

from membench import run_sweep
from membench.api import plan
from membench.cli import build_parser, run_options
from membench.common.errors import UserError
from tests.helpers import cli, probe_in_process


def test_the_cli_and_the_api_plan_the_same_jobs_by_default():
    args = build_parser().parse_args(["run", "--workload", "gpt-tiny", "--batch-size", "8", "--device", "cpu"])
    assert plan("gpt-tiny", None, 8, "cpu", **run_options(args)) == plan("gpt-tiny", None, 8, "cpu")


# --- validators: each option's bound and message written once (spec.CHECKS), used by the CLI and the API --------

def _bad_values(check) -> list:
    """Values just outside the check's range, as the type the CLI parses its text into (0.0, not 0, for a float
    option: the message shows the value as given)."""
    if check.kind is float:
        return [float("nan"), float(check.low) if check.positive else float(check.low - 1)]
    return [check.low - 1] + ([check.high + 1] if check.high is not None else [])


def _spec_fields() -> set[str]:
    """The numeric fields of the specs (the rest of spec.CHECKS are options of predict, fit and replay)."""
    import dataclasses

    from membench.spec import LaunchSpec, MeasureSpec, RunSpec

    return {f.name for cls in (RunSpec, MeasureSpec, LaunchSpec) for f in dataclasses.fields(cls)
            if {"int", "float"} & set(str(f.type).replace("|", " ").split())}


def _cases(fields=None):
    from membench.spec import CHECKS

    for field, check in CHECKS.items():
        if field not in (_spec_fields() if fields is None else fields):
            continue
        for value in _bad_values(check):
            # --memory-budget's text is a size, read by units.parse_bytes, which refuses 0 itself (its own words).
            if not (field == "memory_budget" and value < 1):
                yield pytest.param(field, value, id=f"{field}={value}")


@pytest.mark.parametrize("field,value", list(_cases()))
def test_the_cli_and_the_api_refuse_a_bad_value_with_one_message(monkeypatch, tmp_path, field, value):
    from membench.spec import CHECKS

    options = {"batch_size": 8, "device": "cpu", "techniques": "baseline"} | {field: value}
    with pytest.raises(UserError) as refused:
        run_sweep("gpt-tiny", out=tmp_path / "out", **options)
    message = str(refused.value)
    assert message.startswith(f"{CHECKS[field].option} must be ") and message.endswith(f", got {value!r}")
    assert not (tmp_path / "out").exists()  # refused before anything ran
    if field == "check_steps":  # no CLI option: the API's and a spec file's alone
        return
    args = ["run", "--workload", "gpt-tiny", "--batch-size", "8", "--device", "cpu", "--techniques", "baseline",
            "--out", tmp_path / "out", CHECKS[field].option, str(value)]
    with probe_in_process(monkeypatch):
        proc = cli(*(str(a) for a in args))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"error: {message} (see membench run --help)" in lines[0]


def test_every_numeric_option_of_the_specs_has_its_check():
    """A new count, rate or time on a spec gets its bound in spec.CHECKS, or neither the CLI nor the API checks it."""
    from membench.spec import CHECKS

    assert _spec_fields() <= set(CHECKS)
    assert set(CHECKS) - _spec_fields() == set(COMMAND_OPTIONS)


# The checks of options that set no spec field, and the command line each is given on (before the bad value).
COMMAND_OPTIONS = {"world_size": ["predict"], "jobs": ["fit", "--budget", "1GiB"],
                   "max_batch": ["fit", "--budget", "1GiB"], "memory_fraction": ["replay", "snapshot.pickle"]}


@pytest.mark.parametrize("field,value", list(_cases(set(COMMAND_OPTIONS))))
def test_the_options_of_predict_fit_and_replay_are_bounded_by_the_same_table(field, value):
    from membench.spec import CHECKS

    command = COMMAND_OPTIONS[field]
    proc = cli(*command, CHECKS[field].option, str(value))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"error: {CHECKS[field].option} must be {CHECKS[field].valid}, got {value!r}" in lines[0]
