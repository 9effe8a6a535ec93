"""The HTML report: self-contained, and drawn without errors by a real headless browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from nndoctor.core.findings import Finding, Location, Report, Severity
from nndoctor.report.html import render_html, write_html


def test_html_is_self_contained_and_escapes_user_text(observed_report):
    page = render_html(observed_report)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched
    assert "<script src" not in page and "<link" not in page
    report = Report(command=["train.py"])
    report.add(Finding(code="M101", name="eval-in-train-mode", severity=Severity.ERROR,
                       message="</script><script>alert(1)</script>", fix="x", location=Location("a.py", 1)))
    hostile = render_html(report)
    assert "<script>alert(1)" not in hostile
    data = re.search(r'<script type="application/json" id="nndoctor-data">(.*?)</script>', hostile, re.S)
    assert json.loads(data.group(1))["findings"][0]["message"].startswith("</script>")


def test_history_in_the_page_is_bounded_by_the_recorder(observed_report):
    history = observed_report.history.to_json()
    assert len(history["loss"]["steps"]) == observed_report.steps == 24
    assert history["grad_norms"] and history["update_ratios"] and history["inputs"]["max"]["values"]
    assert set(history["dead_fraction"]) == {"1"} and set(history["saturated_fraction"]) == {"3"}


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--enable-logging=stderr", "--v=0", "--window-size=1200,2200"]


@pytest.mark.slow
def test_report_renders_in_headless_chromium(observed_report, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    page = tmp_path / "report.html"
    write_html(observed_report, page)

    def chromium(*args: str) -> subprocess.CompletedProcess:
        profile = tmp_path / f"profile-{len(args)}"
        return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
                               page.as_uri()], capture_output=True, text=True, timeout=120)

    dom = chromium("--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert 'data-rendered="6"' in body, body  # all six plots drawn
    assert "data-errors" not in body, body  # window.onerror saw nothing
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
    assert dom.stdout.count("<svg") >= 6 and "<path" in dom.stdout
    assert 'data-code="O101"' in dom.stdout

    shot = tmp_path / "report.png"
    result = chromium(f"--screenshot={shot}")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    from PIL import Image, ImageStat

    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2200)
    stat = ImageStat.Stat(image)
    assert max(stat.stddev) > 20  # not a blank page
    colours = image.resize((300, 550)).getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # text, pills and plots, not a flat fill


def test_perf_breakdown_is_drawn_from_the_perf_report():
    report = Report(command=["perf", "train.py"])
    report.extra["perf"] = {"breakdown": {"steps": 10, "median_step_s": 0.05,
                                          "phases_s": {"data_wait": 0.3, "forward": 0.1, "other": 0.1},
                                          "fractions": {"data_wait": 0.6, "forward": 0.2, "other": 0.2}}}
    page = render_html(report)
    table = page.split('id="perf-breakdown">', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 3
    assert "30.00 ms" in table and "60.0%" in table and 'style="width:60.0%"' in table
    assert "median step 50.0 ms over 10 measured steps" in page
