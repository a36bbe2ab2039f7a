"""`membench report` and `membench compare`: the files, a self-contained HTML page, escaping, deltas."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from membench.cli import main
from membench.common.errors import UserError
from membench.gate import compare
from membench.report import explain
from membench.report.write import write_report
from membench.results import load_dir, read_result, write_record
from tests.sweeps import tiny_sweep

HOSTILE = '<script>alert("x")</script><img src=http://evil.example/x.png onerror=alert(1)>'


class Refs(HTMLParser):
    """Every tag, and every URL-carrying attribute, in a page."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "poster", "data") and value is not None:
                self.urls.append((tag, name, value))


def external_refs(page: str) -> list:
    """What a browser could fetch from elsewhere: any src/href that is not in-page (#), data: or a local link."""
    refs = Refs()
    refs.feed(page)
    bad = [(t, n, v) for t, n, v in refs.urls
           if not (v.startswith(("#", "data:")) or (t == "a" and n == "href" and ":" not in v.split("/")[0]))]
    css = re.findall(r"@import|url\((?!#)[^)]*\)", "".join(re.findall(r"<style[^>]*>(.*?)</style>", page, re.S)))
    # An inline script is part of the page (the timeline's); one with src is caught above as a URL.
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", page, re.S | re.I)
    fetching = [m for js in scripts for m in re.findall(r"\bfetch\(|XMLHttpRequest|\bimport\(|WebSocket|"
                                                         r"EventSource|sendBeacon|\.src\s*=|\bhref\s*=", js)]
    return bad + css + fetching + [t for t in refs.tags if t in ("link", "iframe", "object", "embed", "base")]


@pytest.fixture()
def sweep(tmp_path) -> Path:
    return tiny_sweep(tmp_path)


def test_report_writes_every_file(sweep, tmp_path):
    out = tmp_path / "report"
    written = write_report(load_dir(sweep), out)
    expected = {"report.html", "report.md", "results.csv"} | {f"{c}.{e}" for c in ("peak", "timelines", "pareto")
                                                              for e in ("png", "svg")}
    assert set(written) == expected
    for name in expected:
        assert (out / name).stat().st_size > 200, name
    assert (out / "peak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv = pd.read_csv(out / "results.csv")
    assert list(csv["run"]) == ["baseline", "opt-in-bwd"]
    base = read_result(sweep / "baseline.json")
    assert csv.peak_allocated_bytes[0] == base.memory.peak_allocated_bytes
    md = (out / "report.md").read_text()
    assert "| baseline" in md and "![timelines](timelines.png)" in md and "optimizer state" in md


def test_html_is_self_contained_and_complete(sweep, tmp_path):
    write_report(load_dir(sweep), tmp_path / "r")
    page = (tmp_path / "r" / "report.html").read_text()
    assert external_refs(page) == []
    # The peak and pareto charts, and the interactive timeline: two SVGs (phase band, plot) per run.
    assert page.count("<svg") == 2 + 2 * 2 and 'id="timeline"' in page and 'id="chart-timelines"' not in page
    assert page.count('class="tl-row"') == 2 and "<script>" in page
    # Each technique's breakdown, phase, verdict, and the environment.
    assert "optimizer step phase to the backward phase" in page
    assert "bitwise" in page and "Peak phase: <b>optimizer</b>" in page and "torch" in page
    # Links to the timeline files resolve, relative to the report.
    links = [v for t, n, v in Refs_of(page) if t == "a"]
    assert links and all((tmp_path / "r" / link).resolve().exists() for link in links)
    # Chart ids are unique in the page (each inline SVG gets its own prefix).
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))


def Refs_of(page: str):
    refs = Refs()
    refs.feed(page)
    return refs.urls


def test_the_external_ref_check_can_fail():
    assert external_refs('<img src="https://cdn.example/x.png">')
    assert external_refs('<link rel="stylesheet" href="x.css">')
    assert external_refs("<style>@import url(https://fonts.example/a.css);</style>")
    assert external_refs('<script src="https://cdn.example/x.js"></script>')
    assert external_refs("<script>fetch('https://x.example/')</script>")
    assert not external_refs("<script>document.title = 'x'</script>")
    assert not external_refs('<a href="../baseline.timeline.json">t</a><svg><use xlink:href="#c0-x"/></svg>')


def test_hostile_text_from_results_is_escaped(sweep, tmp_path):
    planted = read_result(sweep / "opt-in-bwd.json")
    planted.name, planted.status, planted.error = HOSTILE, "error", HOSTILE
    planted.equivalence.detail = HOSTILE
    planted.env.device_name = HOSTILE
    write_record(sweep / "planted.json", planted)
    write_report(load_dir(sweep), tmp_path / "r")
    page = (tmp_path / "r" / "report.html").read_text()
    refs = Refs()
    refs.feed(page)
    assert "img" not in refs.tags and refs.tags.count("script") == 2  # the timeline's data and code only
    assert HOSTILE not in page and page.count("&lt;script&gt;") >= 3  # name, error, detail, device name
    assert external_refs(page) == []


def test_a_sentence_tells_apart_peaks_a_few_bytes_apart(sweep):
    base, fused = (read_result(sweep / f"{n}.json") for n in ("baseline", "opt-in-bwd"))
    base.memory.peak_allocated_bytes, fused.memory.peak_allocated_bytes = 38_232_512, 38_232_500
    text = " ".join(explain.explain(fused, base))
    assert "lowers the peak from 38,232,512 B to 38,232,500 B" in text


def test_explanations_come_from_the_numbers(sweep):
    results = load_dir(sweep)
    lines = explain.explain_all(results)
    text = " ".join(lines["opt-in-bwd"])
    base, fused = (read_result(sweep / f"{n}.json") for n in ("baseline", "opt-in-bwd"))
    saved = base.memory.peak_allocated_bytes - fused.memory.peak_allocated_bytes
    from membench.common.units import fmt_bytes

    assert f"{fmt_bytes(saved)} saved" in text
    assert "less gradients" in text and "moves from the optimizer step phase to the backward phase" in text
    assert "bit for bit" in text
    assert "peak is" in " ".join(lines["baseline"])


def test_report_refuses_two_sweeps(sweep, tmp_path):
    other = read_result(sweep / "baseline.json")
    other.spec = other.spec.with_run(batch_size=64)
    (sweep / "other").mkdir()
    write_record(sweep / "other" / "baseline.json", other)
    with pytest.raises(UserError, match="more than one sweep"):
        write_report(load_dir(sweep), tmp_path / "r")


def test_report_cli(sweep, capsys):
    assert main(["report", str(sweep)]) == 0
    assert (sweep / "report" / "report.html").exists()
    assert "report.html" in capsys.readouterr().out
    assert main(["report", str(sweep / "missing")]) == 2


def test_compare_shows_deltas(sweep, tmp_path, capsys):
    new = tmp_path / "new"
    new.mkdir()
    base = read_result(sweep / "baseline.json")
    old_peak = base.memory.peak_allocated_bytes
    base.memory.peak_allocated_bytes = old_peak + old_peak // 10 * 2  # +20% (to integer bytes)
    base.memory.peak_phase = "backward"
    write_record(new / "baseline.json", base)
    head, body, notes = compare.table(load_dir(sweep), load_dir(new))
    rows = {r[0]: dict(zip(head, r)) for r in body}
    pct = (old_peak // 10 * 2) / old_peak * 100
    assert rows["baseline"]["workload"] == "vit-tiny bs1"
    assert rows["baseline"]["Δ peak %"] == f"{pct:+.1f}%"
    assert rows["baseline"]["peak phase old → new"] == "optimizer → backward"
    assert rows["baseline"]["Δ throughput %"] == "within noise (+0.0%)"  # the same timing: no difference
    assert "opt-in-bwd" not in rows and any("OLD's opt-in-bwd" in n for n in notes)
    md = tmp_path / "cmp.md"
    assert main(["compare", str(sweep), str(new), "--markdown", str(md)]) == 0
    assert "optimizer → backward" in capsys.readouterr().out
    assert md.read_text().startswith("| run")


def test_compare_pairs_by_spec_not_by_name(sweep, tmp_path, capsys):
    """vit-small at batch 1 is not the baseline of vit-tiny at batch 4, whatever their names."""
    new = tmp_path / "new"
    new.mkdir()
    other = read_result(sweep / "baseline.json")
    other.spec = other.spec.with_run(batch_size=4)
    write_record(new / "baseline.json", other)
    assert main(["compare", str(sweep), str(new)]) == 2
    err = capsys.readouterr().err
    assert "nothing comparable" in err and "vit-tiny bs4" in err and len(err.strip().splitlines()) == 1
    same = read_result(sweep / "baseline.json")
    write_record(new / "same.json", same)
    assert main(["compare", str(sweep), str(new)]) == 0
    out = capsys.readouterr().out
    assert "not compared: NEW's baseline (vit-tiny bs4) has no run with the same spec in OLD" in out


def test_report_separates_sweeps_and_never_compares_across(sweep, tmp_path, capsys):
    other = read_result(sweep / "baseline.json")
    other.spec = other.spec.with_run(workload="gpt-tiny")
    other.timing.throughput *= 50  # tokens/s against samples/s: a +4900% that must never be printed
    (sweep / "other").mkdir()
    write_record(sweep / "other" / "baseline.json", other)
    assert main(["report", str(sweep), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "vit-tiny, batch 1, cpu:" in out and "gpt-tiny, batch 1, cpu:" in out
    assert "+4900" not in out and "shown apart" in out
    assert (tmp_path / "r" / "vit-tiny-bs1-cpu" / "report.html").exists()
    assert (tmp_path / "r" / "gpt-tiny-bs1-cpu" / "report.html").exists()


def test_memory_units_follow_the_magnitudes(sweep):
    from membench.common.units import ByteFormat
    from membench.report.table import rows as table_rows

    head, body = table_rows(load_dir(sweep))
    assert head[3] == "peak alloc MiB"  # vit-tiny at batch 1: tens of MiB, not 0.0xx GiB
    assert ByteFormat([512, 900]).unit == "B" and ByteFormat([3 * 2**10]).unit == "KiB"
    # Values either side of a boundary must not print the same.
    fmt = ByteFormat([2 * 2**30 - 2**20, 2 * 2**30 + 2**20])
    assert fmt(2 * 2**30 - 2**20) != fmt(2 * 2**30 + 2**20)
    # 12 bytes apart at 36 MiB: no number of MiB decimals up to 4 tells them apart, so whole bytes do.
    fmt = ByteFormat([38_232_500, 38_232_512])
    assert fmt.with_unit(38_232_500) == "38,232,500 B" and fmt.with_unit(38_232_512) == "38,232,512 B"


def test_two_byte_values_in_one_sentence_never_print_alike():
    from membench.common.units import fmt_bytes, fmt_bytes_apart

    assert fmt_bytes(38_232_500) == fmt_bytes(38_232_512) == "36.46 MiB"  # why sentences need more than fmt_bytes
    assert fmt_bytes_apart(38_232_500, 38_232_512) == ("38,232,500 B", "38,232,512 B")
    assert fmt_bytes_apart(196_945_592, 77_636_240) == ("187.82 MiB", "74.04 MiB")  # apart already: as before


@pytest.mark.slow
def test_run_then_report_end_to_end(tmp_path, capsys):
    """The real CLI: runs in subprocesses (leaving runs/*.spec.json and logs beside the results), then the report."""
    out = tmp_path / "sweep"
    assert main(["run", "--workload", "vit-tiny", "--batch-size", "1", "--techniques", "opt-in-bwd", "--steps", "1",
                 "--warmup", "1", "--no-check", "--device", "cpu", "--out", str(out)]) == 0
    assert (out / "runs" / "baseline.spec.json").exists() and (out / "baseline.timeline.json").exists()
    printed = capsys.readouterr().out
    # The end of `membench run`: the recommendation, here honest that nothing was checked for equivalence.
    assert "Recommendation (goal: the lowest peak that trains the same model, saving at least 5%" in printed
    assert "Not recommended: opt-in-bwd" in printed and "not checked" in printed
    assert main(["report", str(out)]) == 0
    page = (out / "report" / "report.html").read_text()
    assert page.count("<svg") == 2 + 2 * 2 and external_refs(page) == []  # peak, pareto; the timeline's rows


def test_hostile_names_in_the_timeline_data_stay_data(sweep, tmp_path):
    """A run or module name from a result file reaches the timeline's embedded JSON: it must not end the script."""
    import json

    from membench.report import timeline_html
    from membench.trackers import timeline as tl

    planted = read_result(sweep / "opt-in-bwd.json")
    planted.name = HOSTILE
    data = tl.load(sweep / planted.timeline.file)
    data.modules = [HOSTILE + "</script>" for _ in data.modules]
    (sweep / planted.timeline.file).write_text(data.to_json())
    section = timeline_html.render([planted])
    embedded = section.split('<script type="application/json" id="tl-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in embedded and json.loads(embedded)["runs"][0]["name"] == HOSTILE
    assert HOSTILE not in section and "&lt;script&gt;" in section


def test_report_prints_where_the_baseline_peak_comes_from_as_run_does(sweep, capsys):
    from membench.report.table import top_modules_text

    base = next(r for r in load_dir(sweep) if r.name == "baseline")
    block = top_modules_text(base)
    assert block and block.startswith("where baseline's peak")
    assert main(["report", "--no-files", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert block in out and out.index(block) < out.index("Recommendation")


def test_timeline_header_names_the_timeline_step_of_its_peak(sweep):
    from membench.report import timeline_html
    from membench.trackers import timeline as tl

    run = read_result(sweep / "baseline.json")
    data = tl.load(sweep / run.timeline.file)
    section = timeline_html.render([run])
    assert f"timeline step {data.peak.step + 1} of {data.steps}" in section


def test_pareto_labels_of_close_points_do_not_overlap():
    from membench.report.charts import label_offsets

    # accum and ckpt nearly on top of each other, opt-in-bwd far away
    offsets = label_offsets([(82.4, 2.2), (74.0, 4.2), (82.5, 2.21), (187.8, 4.1)])
    assert offsets[0] != offsets[2] and offsets[1] == 4 and offsets[3] == 4
    assert label_offsets([(1.0, 1.0)]) == [4]
