"""A full disk or a read-only folder is one line, and what was written before is kept."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from membench.cli import main
from membench.common import fsio
from membench.common.errors import UserError
from membench.results import read_result
from tests.helpers import one_error_line, run_tiny

# --- atomic writes, full disk, read-only folders -------------------------------------------------------------

def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "baseline.json"
    fsio.atomic_write_text(target, "old")
    assert stat.S_IMODE(target.stat().st_mode) == fsio.FILE_MODE  # not mkstemp's 0600

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(UserError, match=r"cannot write .*baseline.json: No space left on device"):
        fsio.atomic_write_text(target, "new" * 100_000)
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]


@pytest.mark.parametrize("code", [errno.ENOSPC, pytest.param(errno.EROFS, marks=pytest.mark.slow)])
def test_full_disk_during_a_sweep_is_one_line_and_keeps_finished_runs(tmp_path, monkeypatch, capsys, code):
    assert run_tiny("--out", str(tmp_path)) == 0
    before = (tmp_path / "baseline.json").read_bytes()

    def full(fd, data):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", full)
    capsys.readouterr()
    assert run_tiny("--out", str(tmp_path)) == 2
    assert os.strerror(code) in one_error_line(capsys)
    monkeypatch.undo()
    assert (tmp_path / "baseline.json").read_bytes() == before
    assert read_result(tmp_path / "baseline.json").status == "ok"


@pytest.mark.slow
def test_full_disk_while_writing_a_report_is_one_line(tmp_path, monkeypatch, capsys):
    assert run_tiny("--out", str(tmp_path)) == 0

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2
    assert "No space left on device" in one_error_line(capsys)


def test_a_lock_file_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    """A read-only --out, even as root (who may write anywhere): the lock is the sweep's first write."""
    from membench.launch import sweep

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / sweep.LOCK_NAME))

    monkeypatch.setattr(sweep.os, "open", read_only)
    with pytest.raises(UserError, match="cannot write in .*: Read-only file system"):
        with sweep.locked(tmp_path):
            pass


def refuse_writes_under(folder: Path, code: int, monkeypatch) -> None:
    """Stand in for a folder the process may not write in (root may write anywhere, so chmod proves nothing as
    root, which is how CI runs): every open for writing under it fails with `code`, as the kernel would say."""
    real_open = os.open

    def guarded(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and Path(os.fsdecode(path)).is_relative_to(folder):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_read_only_out_is_one_line(tmp_path, capsys, monkeypatch, code):
    out = tmp_path / "ro"
    out.mkdir()
    refuse_writes_under(out, code, monkeypatch)
    assert run_tiny("--out", str(out)) == 2
    line = one_error_line(capsys)
    assert str(out) in line and os.strerror(code) in line, line
    assert list(out.iterdir()) == []
