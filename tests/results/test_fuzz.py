"""Property-based fuzzing of what reads untrusted result folders (a CI artifact, a colleague's folder).

Whatever a result file holds, loading it either gives a typed RunRecord or refuses with one UserError naming the
file, and whatever loads renders: the table, the explanations, the comparison, the gate and the whole report
(charts and HTML) raise nothing but UserError.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from membench.common.errors import UserError
from membench.gate import compare
from membench.gate.check import REGRESSION, check
from membench.report import explain
from membench.report.table import render
from membench.report.write import write_report
from membench.results import RunRecord, load_dir, read_result
from membench.results.sweep import Sweep
from tests.sweeps import tiny_sweep

HOSTILE_TEXT = ["", "$\\frac{", "$\\frac{$", "$x^{2}$", "[bold]x[/bold]", "<script>alert(1)</script>",
                "../../etc/passwd", "javascript:alert(1)", "/dev/zero", "\x00", "é" * 300, "-", "nan", "a\nb"]
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                      st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(HOSTILE_TEXT),
                      st.text(max_size=20))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                          max_leaves=12)


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict:
    """A real result file's JSON (baseline and opt-in-bwd runs of vit-tiny, with a timeline each)."""
    sweep = tiny_sweep(tmp_path_factory.mktemp("fuzz"))
    return {p.name: json.loads(p.read_text()) for p in sweep.glob("*.json") if ".timeline." not in p.name} | {
        "_dir": str(sweep)}


def _paths(data, prefix=()):
    """Every path to a value inside the JSON, so a mutation can land anywhere."""
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


def _mutate(data, path, value, delete: bool):
    if not path:
        return value
    target = data
    for key in path[:-1]:
        target = target[key]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


def _loads_or_refuses(text: str) -> RunRecord | None:
    try:
        return RunRecord.from_json(text, "results file x.json")
    except UserError as exc:
        assert "\n" not in str(exc) and "x.json" in str(exc)
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=200), json_value.map(json.dumps)))
def test_any_text_loads_or_is_refused_with_one_line(text):
    _loads_or_refuses(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=json_value, delete=st.booleans())
def test_a_mutated_result_loads_typed_or_is_refused(valid, data, value, delete):
    record = copy.deepcopy(valid["baseline.json"])
    path = data.draw(st.sampled_from(list(_paths(record))))
    mutated = _mutate(record, path, value, delete)
    loaded = _loads_or_refuses(json.dumps(mutated))
    if loaded is not None:
        render(Sweep.group([loaded]))
        explain.explain_all(Sweep.of([loaded]))
        compare.render([loaded], [loaded])


def test_deep_nesting_is_refused_not_a_crash():
    deep = "[" * 100_000 + "]" * 100_000
    assert _loads_or_refuses(deep) is None
    assert _loads_or_refuses(json.dumps({"schema_version": 2, "status": "ok", "name": "x",
                                         "spec": json.loads("[" * 500 + "]" * 500)})) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=json_value, delete=st.booleans())
def test_whatever_loads_renders_a_report_and_passes_through_the_gate(valid, data, value, delete, tmp_path_factory):
    """The whole report (charts, HTML, markdown, CSV) on a folder with one mutated file, and `check` of it against the
    sweep it was copied from."""
    folder = tmp_path_factory.mktemp("mutated")
    shutil.copytree(valid["_dir"], folder, dirs_exist_ok=True)
    record = copy.deepcopy(valid["opt-in-bwd.json"])
    path = data.draw(st.sampled_from(list(_paths(record))))
    (folder / "opt-in-bwd.json").write_text(json.dumps(_mutate(record, path, value, delete)))
    try:
        results = load_dir(folder)
    except UserError:
        return
    try:
        write_report(Sweep.of(results), folder / "report")
    except UserError:
        pass
    # Against the untouched sweep, not against itself: a run whose peak grew never passes a 0% gate.
    [mutated] = [r for r in results if r.path.name == "opt-in-bwd.json"]
    try:
        code, _ = check(Path(valid["_dir"]), folder, ["peak_allocated:0%"])
    except UserError:
        return
    if mutated.memory is not None and (mutated.memory.peak_allocated_bytes
                                       > valid["opt-in-bwd.json"]["memory"]["peak_allocated_bytes"]):
        assert code == REGRESSION


def test_a_truncated_timeline_does_not_break_the_report(valid, tmp_path):
    folder = tmp_path / "sweep"
    shutil.copytree(valid["_dir"], folder)
    timeline = folder / read_result(folder / "baseline.json").timeline.file
    timeline.write_text(timeline.read_text()[: timeline.stat().st_size // 2])
    written = write_report(Sweep.of(load_dir(folder)), folder / "report")
    assert Path(written["report.html"]).exists()


@pytest.mark.parametrize("text", [t for t in HOSTILE_TEXT if t])
def test_hostile_names_and_units_render_in_every_chart(valid, tmp_path, text):
    folder = tmp_path / "sweep"
    shutil.copytree(valid["_dir"], folder)
    record = copy.deepcopy(valid["opt-in-bwd.json"])
    record["name"], record["timing"]["unit"] = text, text
    (folder / "opt-in-bwd.json").write_text(json.dumps(record))
    written = write_report(Sweep.of(load_dir(folder)), folder / "report")
    assert {"peak.png", "timelines.png", "pareto.png", "report.html"} <= set(written)


@pytest.mark.parametrize(("path", "value", "named"), [
    (("memory", "peak_allocated_bytes"), "5" * 5000, "digits"),
    (("name",), "\ud800", "field name"),
    (("name",), "x" * 5000, "field name"),
    (("memory", "peak_allocated_bytes"), 0, "memory.peak_allocated_bytes"),
    (("memory", "peak_allocated_bytes"), -5, "memory.peak_allocated_bytes"),
    (("name",), {"\n": 1e31}, "field name.'\\\\n' is 1e\\+31"),  # a key with a newline: still one line
])
def test_values_no_run_produces_are_refused_naming_the_field(valid, path, value, named):
    record = copy.deepcopy(valid["baseline.json"])
    text = json.dumps(_mutate(record, path, value, delete=False))
    if value == "5" * 5000:
        text = text.replace('"' + value + '"', value)  # a bare 5,000-digit integer, not a string
    with pytest.raises(UserError, match=named) as exc:
        RunRecord.from_json(text, "results file x.json")
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 400


def test_an_ok_result_without_memory_reads_as_not_measured(valid):
    record = copy.deepcopy(valid["baseline.json"])
    record["memory"] = None
    assert RunRecord.from_json(json.dumps(record), "results file x.json").peak is None


# --- the pytest plugin's baseline file ----------------------------------------------------------------------

BASELINE = {"version": 1, "torch": "2.14.1",
            "tests": {"t.py::test_a": {"step": {"peak_bytes": 4000, "breakdown": {"activations": 4000},
                                                "top_modules": [{"module": "0", "category": "activations",
                                                                 "bytes": 4000}]},
                                       "zeros": {"peak_bytes": 0}}}}


class _Config:
    def __init__(self, compare: Path, save: Path):
        self.options = {"membench_save": str(save), "membench_compare": str(compare),
                        "membench_compare_fail": ["peak:5%", "peak:64MiB"]}

    def getoption(self, name):
        return self.options[name]


def _plugin_session(folder: Path) -> None:
    """What a pytest session does with DIR/memory_peaks.json: read it at the start (--membench-compare and
    --membench-save), compare a measurement with every saved block, merge and write it at the end."""
    from membench.gate import pytest_plugin as plugin

    try:
        gate = plugin._Gate(_Config(folder, folder))
    except pytest.UsageError as exc:
        event("refused")
        assert "\n" not in str(exc) and str(folder / plugin.BASELINE_FILE) in str(exc)
        return
    event("used")
    for test, blocks in gate.baselines.items():
        for name in blocks:
            try:
                gate.check(test, plugin.Measurement(name, peak_bytes=4096))
            except pytest.fail.Exception as exc:
                assert str(exc).startswith(f"membench: {test} [{name}] peak 4096 B")
    gate.save()
    plugin.read_baselines(folder / plugin.BASELINE_FILE)  # what it wrote reads back


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=json_value, delete=st.booleans())
def test_a_mutated_baseline_file_is_used_or_refused_in_one_line(data, value, delete, tmp_path_factory):
    folder = tmp_path_factory.mktemp("peaks")
    record = copy.deepcopy(BASELINE)
    path = data.draw(st.sampled_from(list(_paths(record))))
    (folder / "memory_peaks.json").write_text(json.dumps(_mutate(record, path, value, delete)))
    _plugin_session(folder)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=200), json_value.map(json.dumps)))
def test_any_text_as_a_baseline_file_is_used_or_refused_in_one_line(text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("peaks")
    (folder / "memory_peaks.json").write_text(text, errors="surrogateescape")
    _plugin_session(folder)


# --- memory snapshots (membench replay) ------------------------------------------------------------------------

snapshot_leaf = st.one_of(json_leaf, st.integers(min_value=-(2**64), max_value=2**64), st.tuples(st.integers()),
                          st.sampled_from(["alloc", "free_completed", "segment_alloc", "segment_free", "large",
                                           "small", "active_allocated", "inactive"]))
snapshot_value = st.recursive(snapshot_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


def _replays_or_refuses(path: Path) -> None:
    from membench.allocator.replay import format_report, report

    try:
        format_report(report(path, ["expandable_segments:True"]))
        event("replayed")
    except UserError as exc:
        event("refused")
        assert "\n" not in str(exc) and len(str(exc)) < 1000


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=snapshot_value, delete=st.booleans())
def test_a_mutated_snapshot_replays_or_is_refused_in_one_line(data, value, delete, tmp_path_factory):
    """A real-shaped snapshot (tests.allocator.test_simulator.hand_made_snapshot) with one value anywhere replaced or
    removed: `membench replay` answers, or refuses in one line."""
    import pickle

    from tests.allocator.test_simulator import hand_made_snapshot

    snap = hand_made_snapshot()
    path = data.draw(st.sampled_from(list(_paths(snap))))
    target = tmp_path_factory.mktemp("snap") / "snap.pickle"
    target.write_bytes(pickle.dumps(_mutate(snap, path, value, delete)))
    _replays_or_refuses(target)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300))
def test_any_bytes_as_a_snapshot_are_refused_in_one_line(raw, tmp_path_factory):
    import pickle

    from tests.allocator.test_simulator import hand_made_snapshot

    target = tmp_path_factory.mktemp("snap") / "snap.pickle"
    whole = pickle.dumps(hand_made_snapshot())
    target.write_bytes(raw if raw[:1] != b"\x80" else whole[: len(raw)] + raw)  # also truncated, then junk
    _replays_or_refuses(target)


# --- Odd input on the command line: one line and exit 2, or it works --------------------------------------------
def _usage_error(capsys, argv: list[str]) -> str:
    """The one line `membench ARGV` ends with, exit code 2, nothing else on stderr and no traceback."""
    from membench.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("name", ["", " ", "h-1-0-0", "__h100__", "H100_PCIe", "h100x", "NVIDIA", "-" * 300])
def test_a_gpu_name_is_matched_whole_or_refused_with_the_valid_names(capsys, name):
    line = _usage_error(capsys, ["predict", f"--gpu={name}"])
    assert "unknown GPU" in line and "valid: H100, H100-PCIe" in line


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=40), st.sampled_from(["h100", "H100 SXM5", "nvidia h100 80gb hbm3", "t4",
                                                            "rtx 4090", "RTX-4090", "Tesla V100-SXM2-32GB"])))
def test_any_gpu_name_names_one_card_whole_or_is_refused(text):
    from membench.predict import gpus

    key = " ".join(text.replace("-", " ").split()).casefold()
    known = {" ".join(n.replace("-", " ").split()).casefold(): g for g, names in gpus.ALIASES.items()
             for n in (g, *names)}
    try:
        found = gpus.gpu(text)
    except UserError as exc:
        assert key not in known and "\n" not in str(exc)
        return
    assert found.name == known[key]


@pytest.mark.parametrize("argv", [
    ["predict", "--warmup", "9223372036854775808"],
    ["run", "--warmup", "9223372036854775808"],
    ["run", "--steps", "9223372036854775808"],
    ["fit", "--budget", "1GiB", "--jobs", "9223372036854775808"],
    ["fit", "--budget", "1GiB", "--jobs", "0"],
    ["predict", "--jobs", "0"],
    ["predict", "--jobs", "9223372036854775808"],
    ["predict", "--world-size", "1025"],
    ["predict", "--timeout", "1e300"],
    ["run", "--min-time", "1e300"],
    ["replay", "x.pickle", "--memory-fraction", "1.5"],
])
def test_integer_and_time_options_are_bounded_by_the_check_table(capsys, argv):
    from membench.spec import CHECKS

    option = argv[argv.index(next(a for a in argv[1:] if a.startswith("--") and a != "--budget"))]
    line = _usage_error(capsys, argv)
    assert f"{option} must be" in line
    assert any(check.option == option for check in CHECKS.values())


@pytest.mark.parametrize("text, named", [("ckpt,ckpt", "ckpt twice"), ("accum,ckpt+opt-in-bwd,opt-in-bwd+ckpt",
                                                                      "opt-in-bwd+ckpt twice (as ckpt+opt-in-bwd"),
                                         ("baseline,accum,baseline", "baseline twice")])
def test_a_technique_listed_twice_is_refused_naming_it(text, named):
    from membench.techniques import parse_techniques

    with pytest.raises(UserError, match=named.replace("+", r"\+").replace("(", r"\(")):
        parse_techniques(text)


@pytest.mark.parametrize("factory, why", [
    ("os:system", "not an optimizer"), ("builtins:eval", "not an optimizer"),
    ("collections:OrderedDict", "not a subclass of torch.optim.Optimizer"),
    ("torch.optim:Optimizer", "not a subclass of torch.optim.Optimizer"),
    ("torch.optim.adam:adam", "needs more arguments"),
    ("torch.optim:LBFGS", "needs a closure"), ("torch.optim:SparseAdam", "sparse gradients only"),
])
def test_an_optimizer_that_is_none_or_that_the_step_cannot_drive_is_refused_with_why(factory, why):
    from membench.api import plan

    with pytest.raises(UserError, match=why) as refused:
        plan("vit-tiny", "baseline", 4, "cpu", optimizer=factory)
    assert "\n" not in str(refused.value)


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=3),
       noise=st.lists(st.text(alphabet="ab:-x ", max_size=4), min_size=4, max_size=4))
def test_cublas_workspace_config_is_read_as_torch_reads_it(pairs, noise):
    """torch (CublasHandlePool.cpp, parseChosenWorkspaceSize): every ':SIZE:COUNT' found, SIZE x 1024 x COUNT summed
    in 64-bit unsigned arithmetic; none found: a warning and the default. A total no tensor can have is refused."""
    from membench.predict import gpus

    config = noise[0] + "".join(f":{s}:{c}{noise[1 + i % 3]}" for i, (s, c) in enumerate(pairs))
    expected = sum(s * 1024 * c for s, c in pairs) % 2**64 if pairs else None
    if any(ch.isdigit() for ch in "".join(noise)) or (pairs and any(n.startswith(":") for n in noise[1:])):
        return  # noise that could join a pair: not this property's case
    try:
        got = gpus.workspace_from_config(config)
    except UserError as exc:
        assert expected is not None and expected >= 2**63 and "\n" not in str(exc)
        return
    assert got == expected


def test_an_unreadable_cublas_workspace_config_warns_and_takes_torchs_default(capsys):
    from membench.predict import gpus

    env = {"CUBLAS_WORKSPACE_CONFIG": "4096:8"}  # no leading colon: torch's regex finds no pair
    assert gpus.cublas_workspace_bytes((9, 0), env) == 4096 * 1024 * 8
    assert gpus.cublas_workspace_bytes((8, 0), env) == 4096 * 1024 * 2 + 16 * 1024 * 8
    err = capsys.readouterr().err
    assert err.count("Could not parse CUBLAS_WORKSPACE_CONFIG") == 2  # once per default (a process has one GPU)


@pytest.mark.parametrize("config", [":999999999999999999:999999999", ":18446744073709551616:1"])
def test_a_cublas_workspace_config_no_gpu_could_hold_is_one_line_before_anything_runs(capsys, monkeypatch,
                                                                                          config):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
    line = _usage_error_main(capsys, ["predict", "--workload", "vit-tiny", "--techniques", "baseline"])
    assert "CUBLAS_WORKSPACE_CONFIG" in line


def _usage_error_main(capsys, argv: list[str]) -> str:
    """The one line a command that passes argparse ends with (main returns 2 for a UserError)."""
    from membench.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_an_encoder_decoder_hugging_face_model_is_refused_in_one_line():
    pytest.importorskip("transformers")
    from membench.workloads import load_workload

    for name in ("hf:t5", "hf:bart"):
        with pytest.raises(UserError, match="encoder-decoder") as refused:
            load_workload(name)
        assert "\n" not in str(refused.value)


# --- `membench report` on any folder: a report, or one line ----------------------------------------------------
folder_entry = st.one_of(
    st.tuples(st.just("record"), st.sampled_from(["baseline.json", "opt-in-bwd.json"]), json_value, st.booleans()),
    st.tuples(st.just("text"), st.sampled_from(["x.json", "baseline.json", "a.timeline.json", "report"]),
              st.one_of(st.text(max_size=50), json_value.map(json.dumps)), st.booleans()),
    st.tuples(st.just("folder"), st.sampled_from(["sub", "report", "x.json", "runs"]), st.none(), st.booleans()),
    st.tuples(st.just("link"), st.sampled_from(["loop", "ckpt.json", "gone.json"]), st.none(), st.booleans()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), entries=st.lists(folder_entry, max_size=5))
def test_report_on_any_folder_writes_a_report_or_says_why_in_one_line(valid, data, entries, tmp_path_factory,
                                                                      capsys):
    """Records mutated anywhere, stray text, folders and links where result files go: `membench report` answers
    with a report (exit 0 or 1) or one line (exit 2), never a traceback."""
    from membench.cli import main

    folder = tmp_path_factory.mktemp("folder")
    shutil.copytree(valid["_dir"], folder, dirs_exist_ok=True)
    for kind, name, value, nested in entries:
        where = folder / "sub" if nested else folder
        where.mkdir(exist_ok=True)
        target = where / name
        if target.exists() or target.is_symlink():
            continue
        if kind == "record":
            record = copy.deepcopy(valid[name])
            path = data.draw(st.sampled_from(list(_paths(record))))
            target.write_text(json.dumps(_mutate(record, path, value, False)))
        elif kind == "text":
            target.write_text(value)
        elif kind == "folder":
            target.mkdir()
        else:
            target.symlink_to(folder if name == "loop" else folder / "nowhere")
    capsys.readouterr()
    code = main(["report", str(folder)])
    err = capsys.readouterr().err
    assert code in (0, 1, 2) and "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("event", ["a\nb", {"action": "alloc", "addr": "x\ny", "size": 1},
                                   {"action": "alloc", "addr": 0, "size": 1, "stream": "1\n2"}])
def test_a_trace_event_with_a_newline_is_refused_in_one_line(event):
    from membench.allocator.snapshot import _check_event

    with pytest.raises(UserError) as refused:
        _check_event(event)
    assert "\n" not in str(refused.value)
