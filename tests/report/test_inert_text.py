"""Text from result files is inert in every output: the terminal, markdown, HTML."""

from __future__ import annotations

import json

from membench.cli import main

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
