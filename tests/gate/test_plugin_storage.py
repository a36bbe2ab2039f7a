"""The pytest plugin's baseline file (DIR/memory_peaks.json) as a hostile folder or a busy CI machine meets it:
read through one typed, validated reader (a corrupt file is one line naming it and the field), written through
the atomic writer, merged under a lock by sessions that save at once (pytest-xdist's workers), and a folder
that cannot hold it refused at the start."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from membench.common.errors import UserError
from membench.gate import pytest_plugin as plugin

GOOD = {"version": 1, "torch": "2.14.1",
        "tests": {"t.py::test_a": {"step": {"peak_bytes": 4000, "breakdown": {"activations": 4000},
                                            "top_modules": [{"module": "0", "category": "activations",
                                                             "bytes": 4000}]}}}}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_valid_file_reads_typed(tmp_path):
    read = plugin.read_baselines(_write(tmp_path / "b.json", json.dumps(GOOD)))
    block = read.tests["t.py::test_a"]["step"]
    assert block.peak_bytes == 4000 and block.top_modules[0].bytes == 4000


@pytest.mark.parametrize(("text", "named"), [
    ("[]", "not a membench baseline file"),
    ('"x"', "not a membench baseline file"),
    ('{"version": 1, "tests": []}', "field tests must be an object"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": "4000"}}}}', "field tests.t.b.peak_bytes must be int"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": NaN}}}}', "field tests.t.b.peak_bytes must be int"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": [1]}}}}', "field tests.t.b.peak_bytes must be int"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": 1.5}}}}', "field tests.t.b.peak_bytes must be int"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": -1}}}}', "a peak is 0 bytes or more"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": 1e300}}}}', "beyond"),
    ('{"version": 1, "tests": {"t": {"b": {"peak_bytes": ' + "9" * 5000 + "}}}}", "digits"),
    ('{"version": 1, "tests": {"t": {"b": {}}}}', "field tests.t.b.peak_bytes is missing"),
    ('{"version": 1, "tests": {"t": "x"}}', "field tests.t must be an object"),
    ('{"version": 99, "tests": {}}', "upgrade membench"),
    ('{"tests": {}}', "field version is missing"),
    ("[" * 100_000 + "]" * 100_000, "baseline file"),
    ('{"version": 1, "tests": ' + "[" * 5000 + "]" * 5000 + "}", "baseline file"),
    ("\udcff", "not JSON"),
    ("", "not JSON"),
])
def test_a_corrupt_file_is_one_line_naming_it_and_the_field(tmp_path, text, named):
    path = tmp_path / "memory_peaks.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(UserError, match=named) as exc:
        plugin.read_baselines(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value) and len(str(exc.value)) < 400


def test_a_huge_file_is_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin, "MAX_FILE_BYTES", 100)
    with pytest.raises(UserError, match="not a membench baseline file"):
        plugin.read_baselines(_write(tmp_path / "b.json", json.dumps(GOOD)))


@pytest.mark.parametrize("where", ["file", "proc", "sys"])
def test_a_save_folder_that_cannot_hold_files_is_refused_at_the_start(tmp_path, where):
    target = {"file": str(_write(tmp_path / "f", "x")), "proc": "/proc/membench", "sys": "/sys/x/y"}[where]
    with pytest.raises(UserError, match="is a file|kernel file system") as exc:
        plugin._check_save_dir(target)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_baseline_file_that_is_not_a_regular_file_is_refused_not_read(tmp_path, kind):
    path = tmp_path / plugin.BASELINE_FILE
    if kind == "fifo":
        os.mkfifo(path)  # reading it would block the session for ever
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(UserError, match="is not a regular file"):
        plugin._check_save_dir(str(tmp_path))


def test_a_corrupt_file_in_the_save_folder_is_refused_at_the_start(tmp_path):
    _write(tmp_path / plugin.BASELINE_FILE, '{"version": 1, "tests": {"t": {"b": {"peak_bytes": "x"}}}}')
    with pytest.raises(UserError, match="peak_bytes must be int"):
        plugin._check_save_dir(str(tmp_path))


class _Config:
    def __init__(self, save: Path):
        self.options = {"membench_save": str(save), "membench_compare": None, "membench_compare_fail": None}

    def getoption(self, name):
        return self.options[name]


def _save(folder: Path, test: str, slow: bool) -> None:
    gate = plugin._Gate(_Config(folder))
    gate.results[test] = {"b": plugin.Measurement("b", peak_bytes=len(test))}
    if slow:  # widen the window between reading the file and renaming the new one into place
        write = plugin.atomic_write_text
        plugin.atomic_write_text = lambda path, text: (time.sleep(0.2), write(path, text))[1]
    gate.save()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="forks the savers")
def test_sessions_saving_at_once_merge_every_entry(tmp_path):
    """Four sessions (pytest-xdist's workers) read, merge and write the file at the same moment: each holds the
    lock while it does, so all four tests are saved (without it, each reads the file before any has written and
    the last rename wins), and no temporary file is left."""
    ctx = multiprocessing.get_context("fork")
    savers = [ctx.Process(target=_save, args=(tmp_path, f"t.py::test_{i}", True)) for i in range(4)]
    for p in savers:
        p.start()
    for p in savers:
        p.join(60)
        assert p.exitcode == 0
    saved = plugin.read_baselines(tmp_path / plugin.BASELINE_FILE).tests
    assert sorted(saved) == [f"t.py::test_{i}" for i in range(4)]
    assert {p.name for p in tmp_path.iterdir()} == {plugin.BASELINE_FILE, plugin.LOCK_FILE}


def test_a_save_keeps_the_tests_not_run_this_time(tmp_path):
    _write(tmp_path / plugin.BASELINE_FILE, json.dumps(GOOD))
    _save(tmp_path, "t.py::test_b", slow=False)
    saved = plugin.read_baselines(tmp_path / plugin.BASELINE_FILE).tests
    assert saved["t.py::test_a"]["step"].top_modules[0].module == "0" and saved["t.py::test_b"]["b"].peak_bytes == 12


def test_a_symlinked_lock_is_refused_not_written_through(tmp_path):
    victim = _write(tmp_path / "victim", "keep")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / plugin.LOCK_FILE).symlink_to(victim)
    with pytest.raises(UserError, match="symlink"):
        _save(tmp_path / "base", "t.py::test_a", slow=False)
    assert victim.read_text() == "keep"


def test_a_full_disk_at_save_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    _write(tmp_path / plugin.BASELINE_FILE, json.dumps(GOOD))

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("membench.common.fsio.os.fsync", full)
    with pytest.raises(UserError, match="No space left on device"):
        _save(tmp_path, "t.py::test_b", slow=False)
    assert json.loads((tmp_path / plugin.BASELINE_FILE).read_text()) == GOOD
    assert {p.name for p in tmp_path.iterdir()} == {plugin.BASELINE_FILE, plugin.LOCK_FILE}
