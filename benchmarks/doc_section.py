"""A benchmark's printed output written into its own section of a docs page (`--write-doc`), so that every table in
docs/accuracy.md and docs/performance.md is the last thing its script printed, once, with the machine, the versions
and the date it ran on: no per-commit history in the page.

A section is the text between `<!-- written by: KEY -->` and `<!-- end: KEY -->`, KEY naming the script and its
arguments; it is replaced whole.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import io
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCURACY = ROOT / "docs" / "accuracy.md"
PERFORMANCE = ROOT / "docs" / "performance.md"


def where() -> str:
    """The machine, the versions and the date, read without importing torch."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, torch {torch}, {day}")


def markers(key: str) -> tuple[str, str]:
    return f"<!-- written by: {key} -->", f"<!-- end: {key} -->"


def section(page: Path, key: str) -> str:
    """The section's text as the page holds it (without its markers); a missing section is a one-line error."""
    start, end = markers(key)
    text = page.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{page.name} has no section {start} ... {end}")
    return text.split(start, 1)[1].split(end, 1)[0]


def body(printed: str, machine: str | None = None) -> str:
    """What a section holds: where it ran, then the output as printed."""
    return f"\nPrinted on {machine or where()}:\n\n```\n{printed.rstrip()}\n```\n"


def write(page: Path, key: str, text: str) -> None:
    start, end = markers(key)
    old = page.read_text()
    section(page, key)  # refuses a page without the section
    head, rest = old.split(start, 1)
    tail = rest.split(end, 1)[1]
    page.write_text(f"{head}{start}{text}{end}{tail}")


def run_and_write(main: Callable[[], int], page: Path, key: str, machine: str | None = None) -> int:
    """Run `main` (a script's own), echo what it prints, and write it into the page's section when it exits 0."""
    buffer = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s: str) -> int:
            buffer.write(s)
            return sys.__stdout__.write(s)

    with contextlib.redirect_stdout(Tee()):
        code = main()
    if code == 0:
        write(page, key, body(buffer.getvalue(), machine))
        print(f"wrote {page.relative_to(ROOT)} ({key})", file=sys.stderr)
    return code
