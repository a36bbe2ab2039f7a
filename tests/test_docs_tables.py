"""Tables the documentation shows as a command's output are what that command prints now, column for column.

Convention: the line `<!-- test: printed by: membench ARGS -->` right before a fenced block says the block is the
table `membench ARGS` prints (run in a temporary folder), or some of its columns: every column the page shows is
compared, row by row, with the printed column of the same header (the first, where a header repeats); lines
shown after the table (after a blank line) must each be printed as shown. Only deterministic columns belong in such
a table (memory, status, peak phase): cut timing columns, and say so.
The commands are whole models (minutes on a 2-core machine), so running them is marked slow; finding and parsing
the tables is not.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_readme import marked_blocks, user_file, write_user_file

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PRINTED = re.compile(r"^<!-- test: printed by: (membench [^\n]*?) -->[ \t]*\n```[^\n]*\n(.*?)^```",
                     re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]

    def column(self, header: str) -> list[str]:
        i = self.headers.index(header)
        return [row[i] for row in self.rows]


def parse_table(text: str) -> Table:
    """The first table in tabulate's "simple" layout in `text`: its header line, the dashes line (which gives each
    column's span, so headers and cells may hold single spaces), and the rows up to the first blank line."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if i > 0 and re.fullmatch(r"-+( +-+)*", line.strip()))
    spans = [m.span() for m in re.finditer(r"-+", lines[at])]

    def cells(line: str) -> list[str]:
        # the last column runs to the line's end: a cell may be wider than its dashes when tabulate right-pads
        return [line[a:(b if k < len(spans) - 1 else None)].strip() for k, (a, b) in enumerate(spans)]

    body = []
    for line in lines[at + 1:]:
        if not line.strip():
            break
        body.append(cells(line))
    return Table(cells(lines[at - 1]), body)


@dataclass(frozen=True)
class Shown:
    page: str
    command: str
    table: Table
    after: list[str]  # the block's lines after the table: each printed as shown
    files: dict[str, str]  # the page's own code the command runs (mypkg/bench.py), as test_readme writes it


def user_files(text: str) -> dict[str, str]:
    """The page's own code, by path: its marked blocks that tests/test_readme.py writes to files."""
    return {name: body for lang, body in marked_blocks(text) if (name := user_file(lang, body)) is not None}


def shown_tables() -> list[Shown]:
    return [Shown(page.name, command, parse_table(block), [line for line in block.partition("\n\n")[2].splitlines()
                                                          if line.strip()], user_files(page.read_text()))
            for page in PAGES for command, block in PRINTED.findall(page.read_text())]


def test_the_convention_finds_and_parses_a_table():
    text = ("x\n<!-- test: printed by: membench predict --workload w -->\n```\nrun         peak GiB    vs base\n"
            "----------  ----------  ---------\nbaseline    1.50        +0.0%\nckpt x      0.75        -50.0%\n```\n")
    [(command, block)] = PRINTED.findall(text)
    assert command == "membench predict --workload w"
    table = parse_table(block)
    assert table.headers == ["run", "peak GiB", "vs base"]
    assert table.column("run") == ["baseline", "ckpt x"] and table.column("vs base") == ["+0.0%", "-50.0%"]


def test_the_documented_tables_are_found():
    shown = shown_tables()
    assert {s.page for s in shown} >= {"workloads.md"}
    [mine] = [s for s in shown if "mypkg" in s.command]
    assert list(mine.files) == ["mypkg/bench.py"] and "def my_model() -> Workload:" in mine.files["mypkg/bench.py"]
    for s in shown:
        assert s.table.rows and "run" in s.table.headers, f"{s.page}: {s.command}: no table with a run column"


@pytest.mark.slow
@pytest.mark.parametrize("shown", shown_tables(), ids=lambda s: f"{s.page}:{s.command[len('membench '):][:60]}")
def test_a_documented_table_is_what_the_command_prints(shown, tmp_path):
    scripts = Path(sys.executable).parent
    if not (scripts / "membench").exists() and not shutil.which("membench"):
        pytest.skip("membench is not installed as a console script here (pip install -e .)")
    env = {**os.environ, "PATH": os.pathsep.join([str(scripts), os.environ.get("PATH", "")])}
    for name, code in shown.files.items():
        write_user_file(tmp_path, name, code)
    proc = subprocess.run(shlex.split(shown.command), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, f"{shown.command} failed:\n{proc.stderr[-3000:]}"
    printed = parse_table(proc.stdout)
    for header in shown.table.headers:
        assert header in printed.headers, f"{shown.page}: column {header!r} is not printed by {shown.command}"
        assert shown.table.column(header) == printed.column(header), (
            f"{shown.page}: {shown.command}: column {header!r} shows {shown.table.column(header)}, the program "
            f"prints {printed.column(header)}:\n{proc.stdout}")
    missing = [line for line in shown.after if line not in proc.stdout.splitlines()]
    assert not missing, f"{shown.page}: {shown.command} no longer prints {missing}:\n{proc.stdout}"


# `<!-- test: in FILE written by: membench ARGS -->` right before a markdown table: the table is in FILE (relative
# to the folder the command ran in) after `membench ARGS`, or some of its columns (report.md's tables).
WRITTEN = re.compile(r"^<!-- test: in (\S+) written by: (membench [^\n]*?) -->[ \t]*\n((?:\|.*\|\n)+)", re.MULTILINE)


def pipe_table(text: str) -> Table:
    """A markdown table's header and rows (its |---| line skipped)."""
    lines = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.strip().splitlines()]
    return Table(lines[0], [row for row in lines[1:] if not all(set(cell) <= set("-:") for cell in row)])


def pipe_tables(text: str) -> list[Table]:
    return [pipe_table(block) for block in re.findall(r"^((?:\|.*\|\n)+)", text + "\n", re.MULTILINE)]


def written_tables() -> dict[tuple[str, str], list[tuple[str, Table]]]:
    """Per page and command, the (file, table) pairs the page shows as written by it: a command runs once."""
    found: dict[tuple[str, str], list[tuple[str, Table]]] = {}
    for page in PAGES:
        for file, command, block in WRITTEN.findall(page.read_text()):
            found.setdefault((page.name, command), []).append((file, pipe_table(block)))
    return found


def test_the_written_tables_are_found_and_parsed():
    text = ("<!-- test: in out/r.md written by: membench run --workload w -->\n| run | peak |\n|-----|------|\n"
            "| baseline | 1 |\n| ckpt | 2 |\n\ntext\n")
    [(file, command, block)] = WRITTEN.findall(text)
    assert (file, command) == ("out/r.md", "membench run --workload w")
    assert pipe_table(block) == Table(["run", "peak"], [["baseline", "1"], ["ckpt", "2"]])
    shown = written_tables()
    report = ("membench run --workload vit-small --batch-size 1 --techniques ckpt,opt-in-bwd,ckpt+opt-in-bwd "
              "--device cpu --steps 3 --warmup 1 --out results/demo")
    assert [table.headers[:3] for _, table in shown[("report.md", report)]] == [
        ["run", "status", "peak alloc MiB"], ["run", "peak", "peak phase"]]


@pytest.mark.slow
@pytest.mark.parametrize(("key", "tables"), list(written_tables().items()),
                         ids=lambda v: f"{v[0]}:{v[1][len('membench '):][:60]}" if isinstance(v, tuple) else "")
def test_a_documented_file_table_is_what_the_command_writes(key, tables, tmp_path):
    page, command = key
    proc = subprocess.run([sys.executable, "-m", *shlex.split(command)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, f"{command} failed:\n{proc.stderr[-3000:]}"
    for file, shown in tables:
        written = [t for t in pipe_tables((tmp_path / file).read_text()) if t.headers[:1] == shown.headers[:1]
                   and set(shown.headers) <= set(t.headers)]
        assert written, f"{page}: no table in {file} has the columns {shown.headers}"
        for header in shown.headers:
            assert shown.column(header) == written[0].column(header), (
                f"{page}: {file}: column {header!r} shows {shown.column(header)}, {command} writes "
                f"{written[0].column(header)}")


OPTIMIZER_TABLE = re.compile(r"^\| optimizer \| baseline \| peak phase \| opt-in-bwd \| peak phase \|\n"
                             r"\|[-|]+\|\n((?:\|.*\|\n)+)", re.MULTILINE)


def optimizer_rows() -> list[list[str]]:
    """docs/workloads.md's optimizer table: per optimizer, the baseline's and opt-in-bwd's predicted peak
    allocated (GiB) and peak phase, from `membench predict --workload gpt-small --batch-size 1 --optimizer OPT
    --techniques opt-in-bwd`."""
    [body] = OPTIMIZER_TABLE.findall((ROOT / "docs" / "workloads.md").read_text())
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in body.splitlines()]


def test_the_optimizer_table_is_found():
    assert [row[0] for row in optimizer_rows()] == ["adam", "adamw", "sgd", "sgd-momentum", "adafactor"]


@pytest.mark.slow
@pytest.mark.parametrize("row", optimizer_rows(), ids=lambda row: row[0])
def test_the_optimizer_table_is_what_predict_prints(row, tmp_path):
    command = ["membench", "predict", "--workload", "gpt-small", "--batch-size", "1", "--optimizer", row[0],
               "--techniques", "opt-in-bwd"]
    proc = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = parse_table(proc.stdout)
    peaks, phases = printed.column("predicted alloc GiB"), printed.column("peak phase")
    assert printed.column("run") == ["baseline", "opt-in-bwd"]
    assert row[1:] == [peaks[0], phases[0], peaks[1], phases[1]], proc.stdout
