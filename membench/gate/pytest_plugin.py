"""The memory gate where tests already live: a pytest plugin (entry point `membench` in pyproject's pytest11).

    def test_training_step_memory(memory_peak):
        model = make_model()
        with memory_peak("step", model=model) as m:      # or: m = memory_peak(train_step, model, batch)
            train_step(model, batch)
        assert m.peak_bytes < 64 * 2**20

The fixture measures, exactly and on CPU, the peak of tensor memory allocated inside the block (membench's
storage tracker: every storage counted to the byte, the same on every run; tensors that existed before the block,
such as the model's weights, are not counted unless the block copies them). Like pytest-benchmark:

    pytest --membench-save=.membench                          # record baselines (JSON keyed by test node id)
    pytest --membench-compare=.membench --membench-compare-fail=peak:5%

A measurement that breaks a rule fails its test with one line naming the test, the baseline and the current
bytes. Rules are `membench check`'s (membench/gate/check.py): `peak:5%`, `peak:0%`, `peak:64MiB`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from membench.common.errors import UserError
from membench.common.fsio import atomic_write_text, make_dir, open_lock_file
from membench.common.typedjson import build_checked, read_json_file, to_plain
from membench.common.units import fmt_bytes
from membench.gate.check import Rule, parse_rule
from membench.gate.measurement import Measurement

BASELINE_FILE = "memory_peaks.json"
LOCK_FILE = ".memory_peaks.lock"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 64 * 2**20  # a baseline file is a few KiB per test; a bigger one is not one
KERNEL_FS = ("/proc", "/sys", "/dev")  # kernel file systems: no folder for baselines
ALIASES = {"peak": "peak_allocated"}  # what a test measures is the peak of allocated tensor memory


@dataclass
class SavedModule:
    module: str
    category: str
    bytes: int


@dataclass
class SavedBlock:
    peak_bytes: int
    breakdown: dict[str, int] = field(default_factory=dict)
    top_modules: list[SavedModule] = field(default_factory=list)


@dataclass
class BaselineFile:
    """DIR/memory_peaks.json: each test's blocks by node id, then block name."""

    version: int
    tests: dict[str, dict[str, SavedBlock]]
    torch: str = ""


def read_baselines(path: Path) -> BaselineFile:
    """The baseline file, every field's type and range checked, or one UserError naming the file and the field:
    the reader of a result file's (membench.common.typedjson), with the limits of a baseline file."""
    where = f"baseline file {path}"
    plain = read_json_file(path, where, MAX_FILE_BYTES, "a membench baseline file")
    if not isinstance(plain, dict) or "tests" not in plain:
        raise UserError(f"{where} is not a membench baseline file (an object with version and tests)")
    baselines = build_checked(BaselineFile, plain, where)
    if baselines.version > FORMAT_VERSION:
        raise UserError(f"{where} has version {baselines.version}; this membench reads up to {FORMAT_VERSION}: "
                        "upgrade membench")
    negative = [f"{test}.{name}" for test, blocks in baselines.tests.items() for name, block in blocks.items()
                if block.peak_bytes < 0]
    if negative:
        raise UserError(f"{where}: field tests.{negative[0]}.peak_bytes is negative: a peak is 0 bytes or more")
    return baselines


def _check_save_dir(text: str) -> Path:
    """--membench-save's folder, made now (at the start, where a mistake is a usage error, not at the end of
    the session): not a file, not a kernel file system."""
    path = Path(text)
    resolved = path.resolve()
    if any(resolved == Path(k) or resolved.is_relative_to(k) for k in KERNEL_FS):
        raise UserError(f"--membench-save {text}: {resolved} is in a kernel file system ({', '.join(KERNEL_FS)}), "
                        "not a folder for files; name a folder of your own")
    if path.exists() and not path.is_dir():
        raise UserError(f"--membench-save {text} is a file: name a folder (the baselines go in "
                        f"DIR/{BASELINE_FILE})")
    make_dir(path)
    if (path / BASELINE_FILE).exists():
        read_baselines(path / BASELINE_FILE)  # a corrupt file is said now, not after the tests ran
    return path


@contextlib.contextmanager
def _merge_lock(folder: Path):
    """Sessions saving into one folder at once (pytest-xdist's workers, two CI jobs) take turns: each reads the
    file, merges its tests and renames its own temporary file into place under an flock, so none loses
    another's entries. The kernel drops the lock however its holder ends."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; saves there are not merged concurrently
        yield
        return
    fd = open_lock_file(folder, LOCK_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class _Gate:
    """The session's baselines: what --membench-save writes and --membench-compare reads."""

    def __init__(self, config: pytest.Config):
        save = config.getoption("membench_save")
        self.save_dir = self._usage(_check_save_dir, save) if save else None
        compare = config.getoption("membench_compare")
        self.rules = [self._rule(r) for r in config.getoption("membench_compare_fail") or ()]
        if self.rules and not compare:
            raise pytest.UsageError("--membench-compare-fail needs --membench-compare=DIR (the saved baselines)")
        self.baseline_path = Path(compare) / BASELINE_FILE if compare else None
        self.baselines = self._load(self.baseline_path) if self.baseline_path else {}
        self.results: dict[str, dict[str, Measurement]] = {}
        self.rows: list[tuple] = []
        self.saved: Path | None = None
        self.save_error: str | None = None

    @staticmethod
    def _usage(fn, *args):
        try:
            return fn(*args)
        except UserError as exc:
            raise pytest.UsageError(str(exc)) from None

    @staticmethod
    def _rule(text: str) -> Rule:
        metric, sep, limit = text.partition(":")
        metric = ALIASES.get(metric.strip(), metric.strip())
        if metric != "peak_allocated":
            raise pytest.UsageError(f"--membench-compare-fail {text!r}: a test measures its peak; write peak:N% "
                                    "or peak:amount (e.g. peak:5%, peak:0%, peak:64MiB)")
        try:
            return dataclasses.replace(parse_rule(f"{metric}{sep}{limit}"), text=text)  # as the user wrote it
        except UserError as exc:
            raise pytest.UsageError(f"--membench-compare-fail: {exc}") from None

    @staticmethod
    def _load(path: Path) -> dict:
        if not path.is_file():
            raise pytest.UsageError(f"--membench-compare: no baselines at {path} (record them with "
                                    f"--membench-save={path.parent})")
        try:
            return read_baselines(path).tests
        except UserError as exc:
            raise pytest.UsageError(f"--membench-compare: {exc}") from None

    def check(self, nodeid: str, m: Measurement) -> None:
        self.results.setdefault(nodeid, {})[m.name] = m
        base = self.baselines.get(nodeid, {}).get(m.name)
        base_bytes = base.peak_bytes if base is not None else None
        self.rows.append((nodeid, m.name, base_bytes, m.peak_bytes))
        if base_bytes is None:
            return
        for rule in self.rules:
            if rule.broken(base_bytes, m.peak_bytes):
                change = f"{(m.peak_bytes - base_bytes) / base_bytes * 100:+.2f}%" if base_bytes else "new"
                pytest.fail(f"membench: {nodeid} [{m.name}] peak {m.peak_bytes} B ({fmt_bytes(m.peak_bytes)}) vs "
                            f"baseline {base_bytes} B ({fmt_bytes(base_bytes)}) in {self.baseline_path}: "
                            f"{change}, breaks rule {rule.text}", pytrace=False)

    def save(self) -> Path | None:
        """Merge this session's measurements into DIR/memory_peaks.json (tests not run this time are kept)."""
        if not self.save_dir or not self.results:
            return None
        folder = make_dir(self.save_dir)
        path = folder / BASELINE_FILE
        with _merge_lock(folder):
            tests = {}
            if path.exists():
                tests = to_plain(read_baselines(path).tests)
            for nodeid, blocks in self.results.items():
                tests[nodeid] = {name: m.as_json() for name, m in blocks.items()}
            import torch  # measured blocks imported it already: the baseline names the release

            data = {"version": FORMAT_VERSION, "torch": torch.__version__, "tests": dict(sorted(tests.items()))}
            atomic_write_text(path, json.dumps(data, indent=1) + "\n")
        return path


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("membench", "membench memory gate (the memory_peak fixture)")
    group.addoption("--membench-save", metavar="DIR", default=None,
                    help=f"save each memory_peak measurement as the baseline, in DIR/{BASELINE_FILE}")
    group.addoption("--membench-compare", metavar="DIR", default=None,
                    help="compare each memory_peak measurement with the baseline saved in DIR")
    group.addoption("--membench-compare-fail", metavar="RULE", action="append", default=None,
                    help="fail a test whose peak grows past RULE: peak:5%%, peak:0%%, peak:64MiB (repeatable)")


_GATE = pytest.StashKey[_Gate]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_GATE] = _Gate(config)


@pytest.fixture
def memory_peak(request: pytest.FixtureRequest):
    """Measure the exact peak of tensor memory (CPU) of a block: `with memory_peak("name") as m:` or
    `memory_peak(fn, *args)`; see membench.gate.peak. torch is imported here, when a test asks for the fixture,
    not when pytest loads the plugin (every pytest session of an environment with membench installed loads it)."""
    from membench.gate.peak import MemoryPeak

    return MemoryPeak(request, request.config.stash[_GATE])


def pytest_sessionfinish(session: pytest.Session) -> None:
    gate = session.config.stash.get(_GATE, None)
    if gate is not None:
        try:
            gate.saved = gate.save()
        except UserError as exc:  # a full disk, a file corrupted meanwhile: one line, and the session fails
            gate.save_error = f"membench: error: --membench-save: {exc}"
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.USAGE_ERROR


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    gate = config.stash.get(_GATE, None)
    if gate is not None and gate.save_error:
        terminalreporter.write_line(gate.save_error, red=True)
    if gate is None or not gate.rows:
        return
    tr = terminalreporter
    tr.section("membench memory peaks")
    compare = gate.baseline_path is not None
    for nodeid, name, base, current in gate.rows:
        line = f"{nodeid} [{name}]: {fmt_bytes(current)} ({current} B)"
        if compare:
            line += ("  no baseline" if base is None else
                     f"  baseline {fmt_bytes(base)} ({base} B), "
                     + (f"{(current - base) / base * 100:+.2f}%" if base else "new"))
        tr.write_line(line)
    if gate.saved:
        tr.write_line(f"saved {len(gate.results)} test(s)' memory peaks to {gate.saved}")
