"""The four report formats read one SweepView: the terminal, report.md and report.html carry the same numbers and
sentences, and the view is computed once per sweep (issue 43, item 4)."""

from __future__ import annotations

import html
import re

from membench.report import explain, recommend, view, write
from membench.report.table import inert_markdown
from membench.report.terminal import summary_of
from membench.results import load_dir
from membench.results.sweep import Sweep


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"[-+]?\d[\d,.]*%?", text))


def test_markdown_and_html_carry_the_same_numbers(sweep, tmp_path):
    v = view.view(Sweep.of(load_dir(sweep)))
    written = write.write_report(v.sweep, tmp_path / "report")
    md, page = written["report.md"].read_text(), html.unescape(written["report.html"].read_text())
    terminal = summary_of([v])
    said = [*v.advice, *v.notes, *(s for r in v.runs for s in r.story)]
    cells = [c for row in (*v.rows, *v.breakdown_rows) for c in row]
    flat = {name: " ".join(text.split()) for name, text in (("md", md), ("page", page), ("terminal", terminal))}
    for text in said + cells:
        assert text in page, text
        assert " ".join(inert_markdown(text).split()) in flat["md"], text
    for text in [*v.advice, *v.notes, *(c for row in v.rows for c in row)]:  # the terminal: no breakdown table
        assert " ".join(text.split()) in flat["terminal"], text
    # and no number in one file's recommendation that the other lacks
    md_advice = md.split("## Recommendation\n\n", 1)[1].split("\n\n", 1)[0]
    page_advice = page.split('<div class="recommendation">', 1)[1].split("</div>", 1)[0]
    assert _numbers(md_advice) == _numbers(page_advice) and _numbers(md_advice)


def test_the_view_is_computed_once_per_report(sweep, tmp_path, monkeypatch):
    calls = {"recommend": 0, "explain": 0}
    real_recommend, real_explain = recommend.recommend, explain.explain

    def counted_recommend(*args, **kwargs):
        calls["recommend"] += 1
        return real_recommend(*args, **kwargs)

    def counted_explain(*args, **kwargs):
        calls["explain"] += 1
        return real_explain(*args, **kwargs)

    monkeypatch.setattr(view, "recommend", counted_recommend)
    monkeypatch.setattr(explain, "explain", counted_explain)
    s = Sweep.of(load_dir(sweep))
    write.write_report(s, tmp_path / "report")
    assert calls == {"recommend": 1, "explain": len(s.runs)}
