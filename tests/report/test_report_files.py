"""report.html links and reads only files inside the results folder, and writes through no symlink."""

from __future__ import annotations

import json

import pytest

from membench.cli import main
from membench.common import fsio
from tests.helpers import one_error_line

# --- report.html links and reads only files inside the results folder; it writes through no symlink ------------

def _hrefs(page: str) -> list[str]:
    from tests.report.test_report import Refs

    refs = Refs()
    refs.feed(page)
    return [v for t, n, v in refs.urls if n == "href"]


@pytest.mark.parametrize("name", ["javascript:alert(1)", "../../../../etc/passwd", "/etc/passwd", "/dev/zero",
                                  ".", "\u00e9" * 300])  # a name longer than a file system takes (hypothesis found)
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
    assert "is a symlink" in one_error_line(capsys)
    assert list(elsewhere.iterdir()) == []


def test_report_replaces_a_symlinked_file_instead_of_writing_through_it(sweep, tmp_path):
    target = tmp_path / "elsewhere.html"
    target.write_text("not membench's")
    (sweep / "report").mkdir()
    (sweep / "report" / "report.html").symlink_to(target)
    assert main(["report", str(sweep)]) == 0
    assert target.read_text() == "not membench's"
    assert not (sweep / "report" / "report.html").is_symlink()
