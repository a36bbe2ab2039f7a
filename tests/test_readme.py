"""The examples of README.md and docs/*.md run as printed, so the documentation cannot drift from the code.

Convention: a fenced block right after the line `<!-- test: run -->` is run, in the page's order, in one temporary
folder per page (a user's project folder):
- a python block whose first line is `# path/to/file.py` is written to that file (the user's own code);
- any other python block runs as a script (`python block.py`);
- a bash block runs as a script (`bash -e`), with the `membench` console script of this interpreter's
  environment first on PATH: the console script, not `python -m`, because `python -m` puts the working
  directory on the import path by itself and would hide a `module:factory` that does not resolve from it.
Mark only small CPU examples (the whole test should stay within a couple of minutes on a 2-core machine).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- test: run -->"
NOT_RUN = re.compile(r"^<!-- test: not run: .+ -->$")  # a command block shown but not run, and why
BLOCK = re.compile(r"^" + re.escape(MARK) + r"[ \t]*\n```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def marked_blocks(text: str) -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall(text)]


def user_file(lang: str, body: str) -> str | None:
    """The path a marked block is the user's code for (a python block whose first line is `# path/to/file.py`)."""
    first = body.split("\n", 1)[0]
    return first[2:] if lang == "python" and re.fullmatch(r"# [\w./-]+\.py", first) else None


def write_user_file(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    (path.parent / "__init__.py").touch()  # mypkg/bench.py: mypkg is a package


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages with examples to run; the slow ones (the CI recipe end to end, the workloads page's models, hf:llama
# predictions with peft and bitsandbytes) run with -m slow.
SLOW_PAGES = {"ci.md", "finetune.md", "optimizers.md", "predict.md", "workloads.md"}
EXAMPLES = [pytest.param(page, id=page.name, marks=[pytest.mark.slow] if page.name in SLOW_PAGES else [])
            for page in PAGES if marked_blocks(page.read_text())]


def command_blocks(text: str) -> list[tuple[str, str]]:
    """(the line before the fence, the block's first line) of every shell block that runs membench."""
    found = []
    for match in re.finditer(r"^```(?:bash|sh|console)[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if any(line.strip().startswith("membench") for line in match.group(1).splitlines()):
            found.append((before, match.group(1).splitlines()[0]))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_membench_command_shown_is_run_or_says_why_not(page):
    unmarked = [first for before, first in command_blocks(page.read_text())
                if before != MARK and not NOT_RUN.match(before)]
    assert not unmarked, f"{page.name}: command blocks neither run ({MARK}) nor marked '<!-- test: not run: why -->'"


def test_a_command_block_without_a_mark_is_found():
    text = f"x\n```bash\nmembench run\n```\n{MARK}\n```bash\nmembench predict\n```\n"
    assert command_blocks(text) == [("x", "membench run"), (MARK, "membench predict")]


def test_the_convention_finds_the_marked_blocks():
    text = f"a\n{MARK}\n```python\nprint(1)\n```\n\n```bash\nnot marked\n```\n{MARK}\n```bash\necho hi\n```\n"
    assert marked_blocks(text) == [("python", "print(1)\n"), ("bash", "echo hi\n")]
    assert len(marked_blocks((ROOT / "README.md").read_text())) >= 2
    assert sum(len(marked_blocks(page.read_text())) for page in PAGES) >= 6


def test_readme_links_to_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", EXAMPLES)
def test_examples_run_as_printed(page, tmp_path):
    scripts = Path(sys.executable).parent
    if not (scripts / "membench").exists() and not shutil.which("membench"):
        pytest.skip("membench is not installed as a console script here (pip install -e .)")
    env = {**os.environ, "PATH": os.pathsep.join([str(scripts), os.environ.get("PATH", "")]), "MPLBACKEND": "Agg"}
    for i, (lang, body) in enumerate(marked_blocks(page.read_text())):
        if (name := user_file(lang, body)) is not None:
            write_user_file(tmp_path, name, body)
            continue
        if lang == "python":
            command = [sys.executable, "-c", body]
        elif lang in ("bash", "sh", "console"):
            command = ["bash", "-e", "-c", body]
        else:
            raise AssertionError(f"{page.name} block {i}: marked to run, but {lang!r} is neither python nor bash")
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (
            f"{page.name} block {i} ({lang}) failed:\n{body}\n--- stderr:\n{proc.stderr[-3000:]}")


def test_ci_runs_the_test_command_readme_gives():
    """CI must run README's test command as printed, and stop when its install fails (a full disk once did)."""
    readme = (ROOT / "README.md").read_text()
    command = readme.split("Install and run the tests", 1)[1].split("```bash\n", 1)[1].split("\n", 1)[0]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(command) for line in ci_lines), command
    assert f"{command} || exit $?" in ci_lines
