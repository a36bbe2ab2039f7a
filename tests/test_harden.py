"""Nothing lost, nothing hung, nothing trusted that should not be (issue 11): full disks, read-only folders,
kills, concurrent writers, re-runs, diverged losses and hostile result files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from membench.cli import main
from membench.common import fsio
from membench.common.errors import UserError
from membench.results import read_result

TINY = ("--workload", "tests.workloads:mlp", "--batch-size", "4", "--techniques", "baseline", "--steps", "1",
        "--warmup", "1", "--no-check", "--no-timeline")


def run_cli(*args) -> int:
    return main(["run", *TINY, *args])


def _one_error_line(capsys) -> str:
    """The one error line (the sweep's progress lines may come before it), and no traceback."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("membench: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


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


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_full_disk_during_a_sweep_is_one_line_and_keeps_finished_runs(tmp_path, monkeypatch, capsys, code):
    assert run_cli("--out", str(tmp_path)) == 0
    before = (tmp_path / "baseline.json").read_bytes()

    def full(fd, data):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", full)
    capsys.readouterr()
    assert run_cli("--out", str(tmp_path)) == 2
    assert os.strerror(code) in _one_error_line(capsys)
    monkeypatch.undo()
    assert (tmp_path / "baseline.json").read_bytes() == before
    assert read_result(tmp_path / "baseline.json").status == "ok"


def test_full_disk_while_writing_a_report_is_one_line(tmp_path, monkeypatch, capsys):
    assert run_cli("--out", str(tmp_path)) == 0

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2
    assert "No space left on device" in _one_error_line(capsys)


def test_a_lock_file_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    """A read-only --out, even as root (who may write anywhere): the lock is the sweep's first write."""
    from membench.launch import sweep

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / sweep.LOCK_NAME))

    monkeypatch.setattr(sweep.os, "open", read_only)
    with pytest.raises(UserError, match="cannot write in .*: Read-only file system"):
        with sweep.locked(tmp_path):
            pass


def _read_only(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o555)
    if os.access(path, os.W_OK):  # root ignores permissions
        path.chmod(0o755)
        pytest.skip("running as root: a read-only folder is still writable")
    return path


def test_read_only_out_is_one_line(tmp_path, capsys):
    out = _read_only(tmp_path / "ro")
    try:
        assert run_cli("--out", str(out)) == 2
        assert str(out) in _one_error_line(capsys)
    finally:
        out.chmod(0o755)


# --- one writer per results folder; kills and SIGTERM leave nothing running ----------------------------------

def _start_hanging_sweep(out: Path, *extra, workload: str = "tests.workloads:hang", processes: int = 1,
                         ) -> subprocess.Popen:
    """`membench run` of a workload whose step sleeps, returned once its worker processes are running."""
    proc = subprocess.Popen([sys.executable, "-m", "membench", "run", "--workload", workload, "--techniques",
                             "baseline", "--no-check", "--no-timeline", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(_workers(out)) < processes and time.time() < deadline:
        time.sleep(0.2)
    assert len(_workers(out)) >= processes, "the workers never started"
    return proc


def _workers(out: Path) -> list[int]:
    """Pids of worker processes writing into `out`, torchrun included (their command line names the result)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"membench.child.worker" in cmd and any(str(out).encode() in part for part in cmd):
            pids.append(int(proc.name))
    return pids


def _gone(out: Path, within: float = 10.0) -> bool:
    deadline = time.time() + within
    while _workers(out) and time.time() < deadline:
        time.sleep(0.2)
    return not _workers(out)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
def test_a_second_writer_is_refused_and_a_killed_ones_lock_is_released(tmp_path, capsys):
    from membench.launch.sweep import locked

    first = _start_hanging_sweep(tmp_path)
    try:
        capsys.readouterr()
        assert run_cli("--out", str(tmp_path)) == 2
        assert f"in use by another membench run (pid {first.pid})" in _one_error_line(capsys)
    finally:
        first.kill()  # kill -9: nothing of membench's runs, the kernel drops the lock
        first.communicate()
        _kill_workers(tmp_path)
    with locked(tmp_path):
        pass


def _kill_workers(out: Path) -> None:
    """Clean up after a test whose workers outlived their sweep (what the test is about)."""
    for pid in _workers(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
def test_kill_9_of_the_sweep_kills_its_worker(tmp_path):
    sweep = _start_hanging_sweep(tmp_path)
    sweep.kill()
    sweep.communicate()
    try:
        assert _gone(tmp_path, within=5)
    finally:
        _kill_workers(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
def test_kill_9_of_the_sweep_kills_torchrun_and_its_ranks(tmp_path):
    # The baseline finishes; the fsdp run, through torchrun with two gloo ranks, hangs: torchrun and 2 ranks.
    sweep = _start_hanging_sweep(tmp_path, "--techniques", "fsdp", "--device", "cpu", "--nproc-per-node", "2",
                                 workload="tests.workloads:hang_under_torchrun", processes=3)
    time.sleep(2)  # the ranks are inside their step
    sweep.kill()
    sweep.communicate()
    try:
        assert _gone(tmp_path, within=10)
    finally:
        _kill_workers(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
def test_sigterm_stops_the_sweep_like_ctrl_c(tmp_path):
    sweep = _start_hanging_sweep(tmp_path)
    sweep.terminate()
    _, err = sweep.communicate(timeout=60)
    try:
        assert sweep.returncode == 143
        assert "terminated: 0 finished run(s) kept" in err and "Traceback" not in err
        assert _gone(tmp_path, within=5)
    finally:
        _kill_workers(tmp_path)


def test_the_portable_watch_kills_the_workers_group_once_the_sweep_is_gone():
    """The fallback where prctl does not exist: a process watching a pid dies (with its group) once it is gone."""
    sweep = subprocess.Popen(["sleep", "60"])
    watcher = subprocess.Popen([sys.executable, "-c", "import sys, time; from membench.launch import lifeline; "
                                "lifeline.watch(int(sys.argv[1]), 0.1); time.sleep(60)", str(sweep.pid)],
                               start_new_session=True)
    time.sleep(1)
    assert watcher.poll() is None
    sweep.kill()
    sweep.wait()
    assert watcher.wait(timeout=10) == -signal.SIGKILL


# --- resume reuses only runs of the same spec -----------------------------------------------------------------

def test_resume_reuses_only_runs_measured_with_the_same_spec(tmp_path, capsys):
    assert run_cli("--out", str(tmp_path), "--optimizer", "adam") == 0
    first = read_result(tmp_path / "baseline.json")
    capsys.readouterr()
    assert run_cli("--out", str(tmp_path), "--optimizer", "sgd", "--batch-size", "8", "--resume") == 0
    again = read_result(tmp_path / "baseline.json")
    assert again.started != first.started
    assert again.spec.run.optimizer == "sgd" and again.spec.run.batch_size == 8
    err = capsys.readouterr().err
    assert "baseline: not resumed" in err and "optimizer 'adam' -> 'sgd'" in err and "batch_size 4 -> 8" in err
    # The same spec again: kept, and said so.
    assert run_cli("--out", str(tmp_path), "--optimizer", "sgd", "--batch-size", "8", "--resume") == 0
    assert read_result(tmp_path / "baseline.json").started == again.started
    assert "(resumed) baseline: ok" in capsys.readouterr().err


# --- the progress display prints text, never markup -----------------------------------------------------------

def test_progress_prints_brackets_as_text():
    import io

    from rich.console import Console

    from membench.report.live import SweepProgress
    from membench.results import RunRecord, Timing
    from membench.spec import Job, RunSpec

    spec = Job(RunSpec("tests.workloads:mlp", 4, ("ckpt",)))
    progress = SweepProgress([spec], Path("/data/[bold]results"))
    progress.console = Console(file=io.StringIO(), width=400)
    failed = RunRecord(name="ckpt", status="error", spec=spec,
                       error="OSError: could not open shard [/data/train-000.tar]")
    noisy = RunRecord(name="ckpt", status="ok", spec=spec,
                      timing=Timing(step_times_s=[1.0], median_s=1.0, iqr_s=0.5, min_s=1.0, max_s=1.0, noisy=True,
                                    throughput=10.0, unit="samples/s"))
    progress.done(spec, failed, False)
    progress.done(spec, noisy, False)
    progress.note(spec, "[red]not markup[/red]")
    text = progress.console.file.getvalue()
    assert "could not open shard [/data/train-000.tar]" in text
    assert "[noisy timing: treat small differences as noise]" in text
    assert "[red]not markup[/red]" in text


# --- a re-run archives every file of the earlier run, under a name of its own ----------------------------------

def test_a_rerun_archives_the_result_with_its_timeline(tmp_path):
    assert run_cli("--out", str(tmp_path), "--timeline") == 0
    first = read_result(tmp_path / "baseline.json")
    first_timeline = (tmp_path / "baseline.timeline.json").read_bytes()
    assert run_cli("--out", str(tmp_path), "--timeline") == 0
    [folder] = (tmp_path / "previous").iterdir()
    archived = read_result(folder / "baseline.json")
    assert archived.started == first.started
    assert (folder / archived.timeline.file).read_bytes() == first_timeline  # still its own timeline
    assert (folder / "baseline.log").exists()
    assert read_result(tmp_path / "baseline.json").started != first.started
    assert (tmp_path / "baseline.timeline.json").exists()


def test_two_archives_in_the_same_microsecond_do_not_collide(tmp_path):
    from membench.results import archive

    folders = []
    for text in ("first", "second"):
        for name in ("baseline.json", "baseline.timeline.json", "baseline.rank1.oom.pickle", "ckpt+amp.json"):
            (tmp_path / name).write_text(text)
            os.utime(tmp_path / name, (1_700_000_000.5, 1_700_000_000.5))
        folders.append(archive(tmp_path, "baseline"))
    assert folders[0] != folders[1]
    for folder, text in zip(folders, ("first", "second")):
        assert folder.name.startswith("baseline.20231114T221320.500000Z-")
        assert sorted(p.name for p in folder.iterdir()) == ["baseline.json", "baseline.rank1.oom.pickle",
                                                            "baseline.timeline.json"]
        assert (folder / "baseline.timeline.json").read_text() == text
    assert (tmp_path / "ckpt+amp.json").exists()  # another run's file stays


# --- a NaN loss is a diverged run, written as strict JSON ------------------------------------------------------

def test_a_nan_loss_is_diverged_and_the_json_is_strict(tmp_path, capsys):
    args = ("--workload", "tests.workloads:diverging", "--steps", "2", "--out", str(tmp_path))
    assert run_cli(*args) == 0  # like an OOM: the technique's result, not a failed sweep
    text = (tmp_path / "baseline.json").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a result file"))
    assert record["status"] == "diverged" and record["diverged_at_timed_step"] == 0
    assert "the loss became nan at timed step 1 of 2" in record["error"]
    assert record["timing"]["losses"] == [None, None]
    assert run_cli(*args, "--resume") == 0  # finished: resume keeps it
    assert read_result(tmp_path / "baseline.json").started == record["started"]
    assert "(resumed) baseline: diverged" in capsys.readouterr().err


# --- report.html links and reads only files inside the results folder; it writes through no symlink ------------

def _hrefs(page: str) -> list[str]:
    from tests.test_report import Refs

    refs = Refs()
    refs.feed(page)
    return [v for t, n, v in refs.urls if n == "href"]


@pytest.fixture()
def sweep(tmp_path) -> Path:
    from tests.sweeps import tiny_sweep

    return tiny_sweep(tmp_path)


@pytest.mark.parametrize("name", ["javascript:alert(1)", "../../../../etc/passwd", "/etc/passwd", "/dev/zero",
                                  "."])
def test_crafted_side_file_names_are_neither_linked_nor_read(sweep, name):
    from membench.report import charts
    from membench.report.write import write_report
    from membench.results import load_dir
    from membench.results.sweep import Sweep

    (sweep / "javascript:alert(1)").write_text("not a timeline")  # even with a file of that name in the folder
    record = json.loads((sweep / "opt-in-bwd.json").read_text())
    record["timeline"]["file"] = name
    (sweep / "opt-in-bwd.json").write_text(json.dumps(record))
    results = load_dir(sweep)
    assert charts.load_timeline(next(r for r in results if r.name == "opt-in-bwd")) is None
    write_report(Sweep.of(results), sweep)  # the report next to the results: relative links have no '../' in front
    hrefs = _hrefs((sweep / "report.html").read_text())
    assert "baseline.timeline.json" in hrefs
    assert not [h for h in hrefs if ":" in h.split("/")[0] or "passwd" in h or "zero" in h], hrefs


def test_side_files_are_read_up_to_a_bound(sweep, monkeypatch):
    from membench.report import charts
    from membench.results import load_dir

    [base] = [r for r in load_dir(sweep) if r.name == "baseline"]
    assert charts.load_timeline(base) is not None
    monkeypatch.setattr(fsio, "MAX_SIDE_FILE_BYTES", 100)
    assert charts.load_timeline(base) is None


def test_report_does_not_write_through_a_symlink(sweep, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sweep / "report").symlink_to(elsewhere)
    assert main(["report", str(sweep)]) == 2
    assert "is a symlink" in _one_error_line(capsys)
    assert list(elsewhere.iterdir()) == []


def test_report_replaces_a_symlinked_file_instead_of_writing_through_it(sweep, tmp_path):
    target = tmp_path / "elsewhere.html"
    target.write_text("not membench's")
    (sweep / "report").mkdir()
    (sweep / "report" / "report.html").symlink_to(target)
    assert main(["report", str(sweep)]) == 0
    assert target.read_text() == "not membench's"
    assert not (sweep / "report" / "report.html").is_symlink()


# --- nothing written outside --out, through a link, or over a measurement (issue 21) ----------------------------

def _second_sweep(sweep: Path, workload: str) -> None:
    """Another sweep's result in the same folder, its workload named by the file."""
    record = json.loads((sweep / "opt-in-bwd.json").read_text())
    record["name"], record["spec"]["run"]["workload"] = "other", workload
    (sweep / "other.json").write_text(json.dumps(record))


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize("workload", ["../../../../escaped", "ABSOLUTE", "..", "a/../../b\x1b]0;x\x07"])
def test_report_subfolders_named_from_results_stay_inside_the_folder(sweep, tmp_path, workload):
    outside = tmp_path / "outside"
    outside.mkdir()
    _second_sweep(sweep, str(outside / "escaped") if workload == "ABSOLUTE" else workload)
    before = _tree(tmp_path)
    assert main(["report", str(sweep)]) == 0
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("sweep/report/") or p == "sweep/report" for p in new), new
    assert len([p for p in (sweep / "report").iterdir() if p.is_dir()]) == 2


def test_two_sweeps_do_not_write_through_a_symlinked_report_folder(sweep, tmp_path, capsys):
    _second_sweep(sweep, "mlp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sweep / "report").symlink_to(elsewhere)
    assert main(["report", str(sweep)]) == 2
    assert "is a symlink" in _one_error_line(capsys)
    assert list(elsewhere.iterdir()) == []


PREDICT = ("predict", "--workload", "tests.workloads:mlp", "--batch-size", "4", "--techniques", "baseline",
           "--device", "cpu")


def test_a_prediction_never_replaces_a_measurement(tmp_path, capsys):
    assert run_cli("--out", str(tmp_path)) == 0
    measured = (tmp_path / "baseline.json").read_bytes()
    capsys.readouterr()
    assert main([*PREDICT, "--out", str(tmp_path)]) == 2
    assert "holds a measured result" in _one_error_line(capsys)
    assert (tmp_path / "baseline.json").read_bytes() == measured


def test_a_new_prediction_archives_the_earlier_one(tmp_path):
    assert main([*PREDICT, "--out", str(tmp_path)]) == 0
    first = read_result(tmp_path / "baseline.json")
    assert main([*PREDICT, "--out", str(tmp_path)]) == 0
    [folder] = (tmp_path / "previous").iterdir()
    assert read_result(folder / "baseline.json").started == first.started
    assert read_result(tmp_path / "baseline.json").predicted


def test_predict_is_refused_while_a_run_holds_the_folder(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
                               "os.write(fd, b'4242'); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / ".membench.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([*PREDICT, "--out", str(tmp_path)]) == 2
        assert "in use by another membench run (pid 4242)" in _one_error_line(capsys)
        assert not (tmp_path / "baseline.json").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder", "device"])
def test_compare_markdown_writes_only_regular_files(sweep, tmp_path, capsys, kind):
    victim = tmp_path / "victim.md"
    victim.write_text("someone's notes")
    target = {"device": Path(os.devnull)}.get(kind, tmp_path / "table.md")
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    assert main(["compare", str(sweep), str(sweep), "--markdown", str(target)]) == 2
    assert f"--markdown {target} is a" in _one_error_line(capsys)
    assert victim.read_text() == "someone's notes"
    assert (target.is_symlink() if kind == "symlink" else target.is_fifo() if kind == "fifo" else
            target.is_dir() if kind == "folder" else target.is_char_device())


def test_a_symlinked_lock_file_is_refused_not_written_through(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".membench.lock").symlink_to(victim)
    assert run_cli("--out", str(out)) == 2
    assert "is a symlink" in _one_error_line(capsys)
    assert victim.read_text() == "precious"


def test_a_symlinked_log_is_replaced_not_truncated(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "baseline.log").symlink_to(victim)
    assert run_cli("--out", str(out)) == 0
    assert victim.read_text() == "precious"
    assert not (out / "runs" / "baseline.log").is_symlink()


@pytest.mark.parametrize("folder", ["previous", "runs"])
def test_a_symlinked_folder_inside_out_is_refused_and_the_result_kept(tmp_path, capsys, folder):
    out = tmp_path / "out"
    assert run_cli("--out", str(out)) == 0
    kept = (out / "baseline.json").read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(out / folder, ignore_errors=True)
    (out / folder).symlink_to(elsewhere)
    capsys.readouterr()
    assert run_cli("--out", str(out)) == 2
    assert "is a symlink" in _one_error_line(capsys)
    assert list(elsewhere.iterdir()) == []
    assert (out / "baseline.json").read_bytes() == kept


def test_a_factory_that_changes_directory_does_not_move_a_relative_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *TINY, "--workload", "tests.workloads:factory_chdirs", "--out", "rel"]) == 0
    assert read_result(tmp_path / "rel" / "baseline.json").status == "ok"


# --- text from files is inert in every output ------------------------------------------------------------------

HOSTILE_NAME = "evil\x1b]0;PWNED\x07\r\x9b2J\u202e<script>alert(1)</script>[x](javascript:alert(1))"


def test_text_from_result_files_is_inert_on_the_terminal_and_in_markdown(sweep, tmp_path, capsys):
    """A run name holding an OSC sequence (retitles the terminal), CR, a C1 CSI, a bidi override, a <script>
    and a javascript: link: `report`, `check` and `compare` print each control character as its escape
    (`\\x1b`), and report.md and compare's markdown hold no raw HTML and no link."""
    path = sweep / "opt-in-bwd.json"
    record = json.loads(path.read_text())
    record["name"] = HOSTILE_NAME
    record["error"] = "boom\x1b[2J"
    path.write_text(json.dumps(record))
    assert main(["report", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert main(["compare", str(sweep), str(sweep), "--markdown", str(tmp_path / "cmp.md")]) == 0
    assert main(["check", str(sweep), "--baseline", str(sweep), "--rule", "peak_allocated:0%"]) == 0
    more = capsys.readouterr()
    shown = out + err + more.out + more.err
    assert "evil\\x1b]0;PWNED\\x07\\x0d\\x9b2J\\u202e<script>" in out
    for control in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert control not in shown
    for md in (sweep / "report" / "report.md", tmp_path / "cmp.md"):
        text = md.read_text()
        assert "evil\\x1b\\]0;PWNED" in text and "&lt;script&gt;" in text and "\\[x\\](javascript" in text, md
        assert "<script" not in text and "[x](" not in text and "\x1b" not in text
