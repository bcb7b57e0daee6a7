"""The live report in a real headless browser (tier ``full``: ``make test-full``, CI installs Debian's chromium).

Chromium loads ``hybridflow report --serve``'s page twice around a step the run logs: the curves are drawn images,
the values move between the two loads, and a screenshot is taken (``$HYBRIDFLOW_SCREENSHOT_DIR`` keeps it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hybridflow.tracking import Tracking
from hybridflow.tracking.live_report import serve_live_report

pytestmark = pytest.mark.full
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    hint = "install Debian's chromium (apt-get install chromium; .ci/run does)"
    if os.environ.get("HYBRIDFLOW_FULL") == "1":  # make test-full: a missing browser fails the tier
        pytest.fail(f"no headless browser ({', '.join(BROWSERS)}) on PATH: {hint}")
    pytest.skip(f"no headless browser on PATH: {hint}")


def _chromium(browser: str, *args: str, profile: Path) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           f"--user-data-dir={profile}", "--no-first-run", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def _log(run_dir: Path, step: int) -> None:
    with Tracking("p", "live", ["file"], output_dir=run_dir) as tr:
        tr.log({"critic/score/mean": 0.25 * step, "response_length/mean": 10.0 + step, "timing_s/gen": 0.5 + step / 10,
                "timing_s/step": 1.0 + step / 10}, step=step)


def test_the_live_report_in_headless_chromium(tmp_path):
    browser = _browser()
    run_dir = tmp_path / "run"
    for step in (1, 2):
        _log(run_dir, step)
    server = serve_live_report(run_dir, port=0, refresh_s=1)
    url = f"http://127.0.0.1:{server.server_port}/"
    shots = Path(os.environ.get("HYBRIDFLOW_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    try:
        first = _chromium(browser, "--dump-dom", url, profile=tmp_path / "profile").stdout
        _chromium(browser, f"--screenshot={shots / 'live_report.png'}", "--window-size=1400,1800", url,
                  profile=tmp_path / "profile")
        _log(run_dir, 3)
        second = _chromium(browser, "--dump-dom", url, profile=tmp_path / "profile").stdout
    finally:
        server.shutdown()
        server.server_close()
    for dom in (first, second):  # the DOM the browser built: curves are drawn PNGs, the page reloads itself
        for panel in ("Score and reward", "Response length", "Time per stage"):
            assert f'alt="{panel}" src="data:image/png;base64,' in dom, panel
        assert 'http-equiv="refresh" content="1"' in dom
    assert "2 logged records" in first and "3 logged records" in second
    assert "<td>critic/score/mean</td><td>2</td><td>0.5</td>" in first
    assert "<td>critic/score/mean</td><td>3</td><td>0.75</td>" in second
    png = (shots / "live_report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000  # a rendered page, not a blank one
