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
        render([loaded])
        explain.explain_all([loaded])
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
        write_report(results, folder / "report")
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
    written = write_report(load_dir(folder), folder / "report")
    assert Path(written["report.html"]).exists()


@pytest.mark.parametrize("text", [t for t in HOSTILE_TEXT if t])
def test_hostile_names_and_units_render_in_every_chart(valid, tmp_path, text):
    folder = tmp_path / "sweep"
    shutil.copytree(valid["_dir"], folder)
    record = copy.deepcopy(valid["opt-in-bwd.json"])
    record["name"], record["timing"]["unit"] = text, text
    (folder / "opt-in-bwd.json").write_text(json.dumps(record))
    written = write_report(load_dir(folder), folder / "report")
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
