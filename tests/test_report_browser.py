"""report.html in a real headless browser (Debian's chromium): it renders what a person should see, and the page
makes no request that leaves the machine. Skipped where no chromium is installed (CI installs one)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from membench.report.write import write_report
from membench.results import load_dir
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
    assert dom.count("<svg") == 3
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
