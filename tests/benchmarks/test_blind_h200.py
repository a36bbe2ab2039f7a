"""The held-out figures (the first H200 run's blind predictions) in docs/accuracy.md and README are what
benchmarks/blind_h200.py prints from the committed acceptance file, and README's fitted-on and fit figures are the
tables' that docs hold."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import blind_h200  # noqa: E402
import doc_section  # noqa: E402

README = (ROOT / "README.md").read_text()


def _history() -> bool:
    done = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h", "--", blind_h200.ACCEPTANCE], cwd=ROOT,
                          capture_output=True, text=True)
    return done.returncode == 0 and bool(done.stdout.strip())


needs_history = pytest.mark.skipif(not _history(), reason="a clone without the acceptance file's history")


@needs_history
def test_the_accuracy_page_holds_what_the_script_prints(capsys):
    assert blind_h200.main([]) == 0
    printed = capsys.readouterr().out
    data, what = blind_h200.first_version()
    env = data["environment"]
    machine = (f"{env['device_name']}, driver {env['driver_version']}, torch {env['torch']}, membench "
               f"{env['git_commit'][:7]}; {what}")
    assert doc_section.section(doc_section.ACCURACY, blind_h200.KEY) == doc_section.body(printed, machine)


@needs_history
def test_readme_quotes_the_held_out_summary():
    data, what = blind_h200.first_version()
    summary = blind_h200.summary(blind_h200.rows(data), what)
    held = re.search(r"\*\*held out\*\*.*?\):\s+(peak\s+allocated.*?);\s+(peak\s+reserved.*?)\.\s+\*\*Fitted",
                     README, re.S)
    for part in held.groups():
        assert " ".join(part.split()) in summary


def test_readme_quotes_the_fitted_on_summary():
    section = doc_section.section(doc_section.ACCURACY, "benchmarks/validate_gpu_runs.py --write-doc")
    fitted = re.search(r"\*\*Fitted on\*\*.*?traces:\s+(peak\s+allocated.*?;\s+peak\s+reserved\s+within\s+1%"
                       r"\s+on\s+\d+)", README, re.S)
    assert " ".join(fitted.group(1).split()) in " ".join(section.split())


def test_readme_quotes_the_fit_table_docs_hold():
    page = (ROOT / "docs" / "predict.md").read_text()
    table = page.split("membench fit --workload vit_b_16 --budget 24GiB")[1].split("\n## ")[0]  # its section
    batches = dict(re.findall(r"^(\S+)\s+(\d+)\s", table, re.M))
    said = re.search(r"answers\s+batch\s+(\d+)\s+for\s+the\s+baseline\s+and\s+(\d+)\s+with\s+ckpt", README)
    assert said.groups() == (batches["baseline"], batches["ckpt"])


def test_a_section_is_replaced_whole(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("a\n<!-- written by: k -->old<!-- end: k -->\nb\n")
    doc_section.write(page, "k", doc_section.body("x  \n", "m"))
    assert page.read_text() == "a\n<!-- written by: k -->\nPrinted on m:\n\n```\nx\n```\n<!-- end: k -->\nb\n"
    with pytest.raises(SystemExit, match="no section"):
        doc_section.write(page, "other", "y")
