"""The regression gate: exit codes, messages, like-with-like pairing, and a planted regression caught."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from membench import cli, environment
from membench.child import worker
from membench.results import RunRecord, read_result, write_record
from membench.techniques import REGISTRY
from membench.techniques.ckpt import ActivationCheckpointing
from tests.helpers import spec

REPO = Path(__file__).resolve().parents[2]
CI_BASELINE = REPO / "results" / "ci-baseline"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> RunRecord:
    """One real CPU run (vit-tiny, batch 4), in this process: the record every test below varies."""
    out = tmp_path_factory.mktemp("measured") / "baseline.json"
    return worker.run(spec("vit-tiny", batch_size=4), out)


def _write(directory: Path, *records: RunRecord) -> Path:
    for r in records:
        write_record(directory / f"{r.name}.json", r)
    return directory


def _varied(record: RunRecord, name: str | None = None, **memory) -> RunRecord:
    r = copy.deepcopy(record)
    if name:
        r.name = name
    r.memory = dataclasses.replace(r.memory, **memory)
    return r


def _check(capsys, baseline: Path, current: Path, *rules: str, flags=()) -> tuple[int, str, str]:
    argv = ["check", "--baseline", str(baseline), str(current), *(f"--rule={r}" for r in rules), *flags]
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_identical_results_pass(tmp_path, capsys, measured):
    base = _write(tmp_path / "base", measured)
    code, out, _ = _check(capsys, base, base, "peak_allocated:0%", "step_time:15%")
    assert code == 0
    assert "all within the rules" in out


def test_one_byte_more_fails_a_strict_rule_and_names_the_run(tmp_path, capsys, measured):
    peak = measured.memory.peak_allocated_bytes
    base = _write(tmp_path / "base", measured)
    cur = _write(tmp_path / "cur", _varied(measured, peak_allocated_bytes=peak + 1))
    code, out, _ = _check(capsys, base, cur, "peak_allocated:0%")
    assert code == 1
    assert "REGRESSED" in out and "baseline" in out and f"({peak + 1} B)" in out
    assert "1 regression(s)" in out


@pytest.mark.parametrize("grow, rule, expected", [
    (0.04, "peak_allocated:5%", 0), (0.06, "peak_allocated:5%", 1),
    (0.0, "peak_allocated:0%", 0), (-0.5, "peak_allocated:0%", 0),
])
def test_relative_rules(tmp_path, capsys, measured, grow, rule, expected):
    peak = measured.memory.peak_allocated_bytes
    base = _write(tmp_path / "base", measured)
    cur = _write(tmp_path / "cur", _varied(measured, peak_allocated_bytes=int(peak * (1 + grow))))
    assert _check(capsys, base, cur, rule)[0] == expected


def test_absolute_rule_in_bytes(tmp_path, capsys, measured):
    peak = measured.memory.peak_allocated_bytes
    base = _write(tmp_path / "base", measured)
    within = _write(tmp_path / "within", _varied(measured, peak_allocated_bytes=peak + 64 * 2**10))
    over = _write(tmp_path / "over", _varied(measured, peak_allocated_bytes=peak + 64 * 2**10 + 1))
    assert _check(capsys, base, within, "peak_allocated:64KiB")[0] == 0
    assert _check(capsys, base, over, "peak_allocated:64KiB")[0] == 1


def test_throughput_drop_is_the_regression(tmp_path, capsys, measured):
    base = _write(tmp_path / "base", measured)
    faster, slower = copy.deepcopy(measured), copy.deepcopy(measured)
    faster.timing.throughput *= 2
    slower.timing.throughput *= 0.8
    assert _check(capsys, base, _write(tmp_path / "faster", faster), "throughput:10%")[0] == 0
    code, out, _ = _check(capsys, base, _write(tmp_path / "slower", slower), "throughput:10%")
    assert code == 1 and "throughput" in out


def test_a_run_that_now_fails_is_a_regression(tmp_path, capsys, measured):
    oom = copy.deepcopy(measured)
    oom.status = "oom"
    code, out, _ = _check(capsys, _write(tmp_path / "base", measured), _write(tmp_path / "cur", oom),
                          "peak_allocated:5%")
    assert code == 1 and "oom" in out


@pytest.mark.parametrize("problem, message", [
    ("missing", "does not exist"),
    ("corrupt", "is corrupt"),
    ("rule", "cannot read rule"),
    ("no-rule", "no --rule given"),
    ("other-workload", "nothing comparable"),
    ("metric-absent", "nothing comparable"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, measured, problem, message):
    base = _write(tmp_path / "base", measured)
    cur = tmp_path / "cur"
    rules = ["peak_allocated:5%"]
    if problem == "missing":
        cur = tmp_path / "nowhere"
    elif problem == "corrupt":
        cur.mkdir()
        (cur / "baseline.json").write_text("{not json")
    elif problem == "rule":
        _write(cur, measured)
        rules = ["peak_memory:5%"]
    elif problem == "no-rule":
        _write(cur, measured)
        rules = []
    elif problem == "other-workload":
        other = copy.deepcopy(measured)
        other.spec = other.spec.with_run(batch_size=8)
        _write(cur, other)
    elif problem == "metric-absent":  # no reserved memory on CPU: nothing to compare is not a pass
        _write(cur, measured)
        rules = ["peak_reserved:5%"]
    code, out, err = _check(capsys, base, cur, *rules)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_machine_mismatch_is_refused_unless_allowed(tmp_path, capsys, measured):
    elsewhere = copy.deepcopy(measured)
    elsewhere.env.torch = "2.99.0"
    base, cur = _write(tmp_path / "base", measured), _write(tmp_path / "cur", elsewhere)
    code, _, err = _check(capsys, base, cur, "peak_allocated:0%")
    assert code == 2 and "--allow-machine-mismatch" in err and "torch2.99.0" in err
    assert _check(capsys, base, cur, "peak_allocated:0%", flags=["--allow-machine-mismatch"])[0] == 0


def test_predictions_are_not_compared_with_measurements(tmp_path, capsys, measured):
    predicted = copy.deepcopy(measured)
    predicted.predicted = True
    base, cur = _write(tmp_path / "base", measured), _write(tmp_path / "cur", predicted)
    code, _, err = _check(capsys, base, cur, "peak_allocated:0%")
    assert code == 2 and "prediction" in err and "--allow-predicted-vs-measured" in err
    assert _check(capsys, base, cur, "peak_allocated:0%", flags=["--allow-predicted-vs-measured"])[0] == 0


def test_a_baseline_run_missing_from_current_fails_unless_allowed(tmp_path, capsys, measured):
    other = _varied(measured, name="ckpt")
    other.spec = other.spec.with_run(techniques=("ckpt",))
    base = _write(tmp_path / "base", measured, other)
    cur = _write(tmp_path / "cur", measured)  # ckpt vanished
    code, out, _ = _check(capsys, base, cur, "peak_allocated:0%")
    assert code == 1
    missing = [line for line in out.splitlines() if line.startswith("MISSING")]
    assert len(missing) == 1 and " ckpt " in missing[0], out
    code, out, _ = _check(capsys, base, cur, "peak_allocated:0%", flags=["--allow-missing"])
    assert code == 0 and "has no current run" in out


def test_a_current_run_with_no_memory_fails_unless_allowed(tmp_path, capsys, measured):
    empty = copy.deepcopy(measured)
    empty.memory = None
    base, cur = _write(tmp_path / "base", measured), _write(tmp_path / "cur", empty)
    code, out, _ = _check(capsys, base, cur, "peak_allocated:0%")
    assert code == 1 and "MISSING" in out and "peak_allocated" in out
    code, out, _ = _check(capsys, base, cur, "peak_allocated:0%", "step_time:1000%", flags=["--allow-missing"])
    assert code == 0 and "has no peak_allocated" in out


@pytest.mark.parametrize("rule", ["peak_allocated:nan%", "peak_allocated:inf%", "step_time:-inf%"])
def test_rule_values_must_be_finite_numbers(tmp_path, capsys, measured, rule):
    base = _write(tmp_path / "base", measured)
    code, _, err = _check(capsys, base, base, rule)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "finite" in err or "cannot be negative" in err or "not a percentage" in err


class LeakyCheckpointing(ActivationCheckpointing):
    """The planted regression: checkpointing that also keeps a 64 KiB buffer alive for the whole run."""

    def configure(self, state) -> None:
        super().configure(state)
        state.model.register_buffer("leak", torch.zeros(16384))


def _ci_sweep(out: Path) -> Path:
    """The gate's runs for vit-tiny (as .ci/memory-gate makes them), in this process so a test can plant a leak."""
    for name in ("baseline", "ckpt"):
        job = spec("vit-tiny", () if name == "baseline" else (name,), batch_size=4)
        worker.run(job, out / "vit-tiny-bs4" / f"{name}.json")
    return out


def _same_machine_as_ci_baseline() -> bool:
    record = read_result(CI_BASELINE / "vit-tiny-bs4" / "baseline.json")
    here = environment.machine_key(environment.describe("cpu"))
    return environment.machine_key(record.env) == here


@pytest.mark.skipif(not CI_BASELINE.exists(), reason="results/ci-baseline is not committed")
def test_gate_passes_today_and_catches_a_planted_regression(tmp_path, capsys, monkeypatch):
    if not _same_machine_as_ci_baseline():
        pytest.skip("results/ci-baseline was recorded with another torch version; re-record: .ci/memory-gate --update")
    clean = _ci_sweep(tmp_path / "clean")  # two of the baseline's eight runs: the others are allowed missing
    code, out, err = _check(capsys, CI_BASELINE, clean, "peak_allocated:0%", flags=["--allow-missing"])
    assert code == 0, out + err

    monkeypatch.setitem(REGISTRY, "ckpt", LeakyCheckpointing)
    leaky = _ci_sweep(tmp_path / "leaky")
    code, out, _ = _check(capsys, CI_BASELINE, leaky, "peak_allocated:0%", flags=["--allow-missing"])
    assert code == 1
    regressed = [line for line in out.splitlines() if line.startswith("REGRESSED")]
    assert len(regressed) == 1 and " ckpt " in regressed[0], out
    base_peak = read_result(CI_BASELINE / "vit-tiny-bs4" / "ckpt.json").memory.peak_allocated_bytes
    leaky_peak = read_result(leaky / "vit-tiny-bs4" / "ckpt.json").memory.peak_allocated_bytes
    assert leaky_peak - base_peak == 16384 * 4  # exactly the leaked buffer


def test_accum_steps_pairs_only_runs_that_accumulate(tmp_path, capsys, measured):
    """--accum-steps is accum's option: a baseline measured with 4 still pairs with one run with 8 (it never read
    it); an accum run measured with 4 does not pair with one run with 8 (a different micro-batch)."""
    accum = _varied(measured, name="accum")
    accum.spec = accum.spec.with_run(techniques=("accum",))
    base = _write(tmp_path / "base", measured, accum)
    eight = [copy.deepcopy(r) for r in (measured, accum)]
    for r in eight:
        r.spec = r.spec.with_run(accum_steps=8)
    cur = _write(tmp_path / "cur", *eight)
    code, out, _ = _check(capsys, base, cur, "peak_allocated:0%")
    missing = [line for line in out.splitlines() if line.startswith("MISSING")]
    assert code == 1 and len(missing) == 1 and " accum " in missing[0], out
    assert not any(" baseline " in line for line in missing)
    cur_baseline_only = _write(tmp_path / "cur2", eight[0])
    code, out, _ = _check(capsys, _write(tmp_path / "base2", measured), cur_baseline_only, "peak_allocated:0%")
    assert code == 0, out


def test_resume_keeps_a_run_that_never_read_the_changed_accum_steps():
    from membench.launch.sweep import spec_changes

    baseline = spec("vit-tiny", batch_size=4)
    assert spec_changes(baseline, baseline.with_run(accum_steps=8)) == []
    accum = baseline.with_run(techniques=("accum",))
    assert spec_changes(accum, accum.with_run(accum_steps=8)) == ["run.accum_steps 4 -> 8"]
