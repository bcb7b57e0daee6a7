"""``hybridflow report --serve``: the run report served live from a run folder, re-rendered as metrics.jsonl grows.

The page checks run with urllib here; tests/tracking/test_live_report_browser.py (tier ``full``) loads the same
page in headless Chromium."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from hybridflow.tracking import Tracking
from hybridflow.tracking.live_report import LiveReport, serve_live_report


def fetch(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def log_steps(run_dir, steps):
    with Tracking("p", "live", ["file"], output_dir=run_dir) as tr:
        for step in steps:
            tr.log({"critic/score/mean": 0.125 * step, "timing_s/step": 1.0 + 0.01 * step}, step=step)


def test_the_page_follows_the_run_and_reloads_itself(tmp_path):
    server = serve_live_report(tmp_path, port=0, refresh_s=2)
    url = f"http://127.0.0.1:{server.server_port}/"
    try:
        waiting = fetch(url)
        assert "Waiting for" in waiting and "metrics.jsonl" in waiting
        log_steps(tmp_path, [1, 2])
        page = fetch(url)
        assert "<meta http-equiv='refresh' content='2'>" in page and "2 logged records" in page
        assert "<img alt='Score and reward'" in page and "<td>critic/score/mean</td><td>2</td><td>0.25</td>" in page
        log_steps(tmp_path, [3])
        page = fetch(url)
        assert "3 logged records" in page and "<td>critic/score/mean</td><td>3</td><td>0.375</td>" in page
        with pytest.raises(urllib.error.HTTPError, match="404"):
            fetch(url + "metrics.jsonl")  # the page only: no file of the folder is served
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_is_rendered_again_only_when_the_files_change(tmp_path):
    log_steps(tmp_path, [1])
    report = LiveReport(tmp_path)
    first = report.page()
    assert report.page() is first  # unchanged files: the same bytes, no re-render
    log_steps(tmp_path, [2])
    assert report.page() is not first and b"2 logged records" in report.page()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.org"])
def test_only_loopback_addresses_are_served(tmp_path, host):
    with pytest.raises(ValueError, match="loopback addresses only"):
        serve_live_report(tmp_path, host=host)


def test_the_command_serves_until_its_time_is_up(tmp_path):
    log_steps(tmp_path, [1, 2])
    proc = subprocess.Popen([sys.executable, "-m", "hybridflow", "report", str(tmp_path), "--serve", "--port", "0",
                             "--max-seconds", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"hybridflow report: serving {tmp_path}'s live report at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        assert "2 logged records" in fetch(url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the port is closed once the command ends
        try:
            fetch(url)
        except OSError:
            return
        time.sleep(0.2)
    pytest.fail(f"{url} still answers after the command ended")
