"""report.html in a real headless browser (Debian's chromium): it renders what a person should see, and the page
makes no request that leaves the machine. Skipped where no chromium is installed (CI installs one)."""

from __future__ import annotations

import html
import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from membench.report.write import write_report
from membench.results import load_dir
from membench.trackers import timeline as tl
from tests.sweeps import tiny_sweep

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: apt-get install -y chromium")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium(page: Path, tmp_path: Path, *args: str) -> tuple[str, list[dict]]:
    """Open a page; return the DOM (or nothing) and the network requests the *page* started.

    Chromium itself may still call home (component updates, accounts) even with these flags: those requests have
    no origin ("not an origin") and are not the page's. A request the page makes has the page's origin (for a
    file://, "null").
    """
    net_log = tmp_path / f"net-{page.stem}.json"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--log-net-log={net_log}",
                           *args, page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = json.loads(net_log.read_text())
    types = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    requests = [e["params"] for e in log["events"]
                if types.get(e["type"]) == "URL_REQUEST_START_JOB" and "url" in e.get("params", {})
                and e["params"].get("initiator") != "not an origin"]
    return proc.stdout, requests


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    write_report(load_dir(tiny_sweep(tmp)), tmp / "report")
    return tmp / "report" / "report.html"


def test_report_renders_with_charts_and_text(report, tmp_path):
    dom, requests = chromium(report, tmp_path, "--dump-dom")
    assert requests == []
    assert dom.count("<svg") == 2 + 2 * 2  # the peak and pareto charts; each timeline row's band and plot
    for text in ("What each technique did", "opt-in-bwd", "The peak by category", "Environment", "bitwise",
                 "moves from the optimizer step phase to the backward phase"):
        assert text in dom, text


def test_screenshot_shows_a_page(report, tmp_path):
    shot = tmp_path / "shot.png"
    _, requests = chromium(report, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    assert requests == []
    data = shot.read_bytes()
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2400)
    # A blank page compresses to almost nothing; tables and charts do not.
    assert len(data) > 60_000


def test_the_network_check_sees_a_page_that_fetches(tmp_path):
    page = tmp_path / "fetches.html"
    page.write_text('<p>x</p><img src="http://example.invalid/a.png"><link rel=stylesheet href="https://x.invalid/a">')
    _, requests = chromium(page, tmp_path, "--dump-dom")
    assert {r["url"] for r in requests} == {"http://example.invalid/a.png", "https://x.invalid/a"}


# Injected into a copy of the report: the first script records any error the page's own script raises; the last
# one, run once the page's script has run, hovers and clicks the way a person would (real DOM events, dispatched
# at real on-screen coordinates in chromium's layout) and writes what the page did into the DOM.
CATCH_ERRORS = "<script>window.__errors = []; window.addEventListener('error', function (e) { " \
    "window.__errors.push(String(e.message)); });</script>"
INTERACT = """<script>
(function () {
  var out = {errors: window.__errors, steps: []};
  try {
    var root = document.getElementById("timeline");
    out.ready = root.getAttribute("data-ready");
    var wrap = root.querySelector(".tl-row .tl-plotwrap"), r = wrap.getBoundingClientRect();
    out.width = r.width;
    var tip = document.getElementById("tl-tip");
    function at(type, f) {
      wrap.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: r.left + f * r.width,
                                               clientY: r.top + r.height / 2}));
      return {view: root.getAttribute("data-view"), hover: root.getAttribute("data-hover"),
              tip: tip.textContent, tipShown: tip.style.display,
              viewBox: root.querySelector("svg.tl-plot").getAttribute("viewBox")};
    }
    out.steps.push(at("mousemove", 0.30));   // step 0, 60% of the way through it
    out.steps.push(at("click", 0.75));       // zoom to step 1
    out.steps.push(at("mousemove", 0.10));   // now 10% into step 1
    root.querySelector('.tl-controls button[data-view="0-2"]').click();  // back to all steps
    out.steps.push({view: root.getAttribute("data-view"),
                    viewBox: root.querySelector("svg.tl-plot").getAttribute("viewBox")});
    wrap.dispatchEvent(new MouseEvent("mouseleave", {bubbles: false}));
    out.afterLeave = tip.style.display;
  } catch (e) { out.errors.push("harness: " + e); }
  var pre = document.createElement("pre");
  pre.id = "test-result";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def interact(report: Path, tmp_path: Path) -> tuple[dict, list[dict]]:
    page = report.read_text()
    page = page.replace("<head>", "<head>" + CATCH_ERRORS, 1).replace("</body>", INTERACT + "</body>", 1)
    copy = report.with_name("report-interactions.html")
    copy.write_text(page)
    dom, requests = chromium(copy, tmp_path, "--dump-dom", "--window-size=1400,1000")
    result = dom.split('<pre id="test-result">', 1)[1].split("</pre>", 1)[0]
    return json.loads(html.unescape(result)), requests


def test_timeline_hover_and_zoom_work_in_the_browser_and_fetch_nothing(report, tmp_path):
    out, requests = interact(report, tmp_path)
    assert requests == []
    assert out["errors"] == [] and out["ready"] == "true" and out["width"] > 1000  # full width, not squeezed
    hover, zoomed, hover_zoomed, back = out["steps"]
    timeline = tl.load(report.parent.parent / "sweep" / "baseline.timeline.json")

    # Hover: the tooltip shows the run, the step, the phase, the bytes by category and the module at that point.
    name, index = hover["hover"].split("@")
    i = int(index)
    assert name == "baseline" and hover["tipShown"] == "block" and hover["view"] == "0-2"
    following = timeline.x[i + 1] if i + 1 < len(timeline.x) else 2
    assert timeline.x[i] <= 0.6 + 0.005 and following > 0.6 - 0.005  # the point under the cursor (within 1 px)
    phase = timeline.phases[timeline.phase[i]]
    module = timeline.modules[timeline.module[i]]
    text = hover["tip"]
    assert text.startswith("baseline") and f"step 0, {phase} phase" in text and f"module: {module}" in text
    live = sum(timeline.bytes[c][i] for c in timeline.categories)
    assert "live: " in text and "parameters" in text and (f"{live} B" in text or "KiB" in text or "MiB" in text)

    # Click: every row zooms to the clicked step; a hover then reads inside that step.
    assert zoomed["view"] == "1-2" and zoomed["viewBox"] == "1000 0 1000 1000"
    name, index = hover_zoomed["hover"].split("@")
    assert timeline.x[int(index)] <= 1.1 and "step 1," in hover_zoomed["tip"]
    # The button zooms back out; leaving the plot hides the tooltip.
    assert back == {"view": "0-2", "viewBox": "0 0 2000 1000"}
    assert out["afterLeave"] == "none"


def test_the_interaction_harness_sees_a_script_error(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><head></head><body><section id='timeline'></section>"
                    "<script>undefined_function();</script></body></html>")
    out, _ = interact(page, tmp_path)
    assert any("undefined_function" in e for e in out["errors"])
