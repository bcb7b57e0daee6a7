"""The run report, live: ``hybridflow report --serve RUN_DIR`` serves the report page of a run folder on the
loopback interface while the run writes into it.

The page is the end-of-run report (:func:`hybridflow.tracking.report.render_report`) of ``RUN_DIR/metrics.jsonl``
and ``RUN_DIR/generations.jsonl`` (what ``trainer.logger=[...,file]`` writes), rendered again whenever one of the
two files changed since the last request, and told to reload itself every ``refresh_s`` seconds. Before the first
record the page says what it waits for. Only loopback addresses are served: the page shows prompts and model
outputs, and has no authentication.
"""

from __future__ import annotations

import html
import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from hybridflow.tracking.report import load_history, load_samples, render_report

__all__ = ["LiveReport", "serve_live_report"]


class LiveReport:
    """The page of one run folder, re-rendered only when its files changed (size or modification time)."""

    def __init__(self, run_dir: str | Path, refresh_s: float = 5.0):
        self.run_dir = Path(run_dir)
        self.refresh_s = float(refresh_s)
        self._stamp: tuple | None = None
        self._page = b""
        self._lock = threading.Lock()

    def _files_stamp(self) -> tuple:
        stamp = []
        for name in ("metrics.jsonl", "generations.jsonl"):
            path = self.run_dir / name
            st = path.stat() if path.is_file() else None
            stamp.append((st.st_size, st.st_mtime_ns) if st else None)
        return tuple(stamp)

    def page(self) -> bytes:
        with self._lock:
            stamp = self._files_stamp()
            if stamp != self._stamp or not self._page:
                self._page = self._render(stamp).encode("utf-8")
                self._stamp = stamp
            return self._page

    def _render(self, stamp: tuple) -> str:
        head = f"<meta http-equiv='refresh' content='{self.refresh_s:g}'>"
        title = f"{self.run_dir.name} (live)"
        if stamp[0] is None:
            wait = (f"<p>Waiting for <code>{html.escape(str(self.run_dir / 'metrics.jsonl'))}</code>: start the run "
                    "with <code>trainer.logger=[console,file]</code> writing here. This page reloads every "
                    f"{self.refresh_s:g} s.</p>")
            return render_report([], [], title=title, head=head).replace("<h2>Curves</h2>", wait + "<h2>Curves</h2>")
        history = load_history(self.run_dir / "metrics.jsonl")
        samples = load_samples(self.run_dir / "generations.jsonl") if stamp[1] is not None else []
        return render_report(history, samples, title=title, head=head)


def _check_loopback(host: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"the live report serves loopback addresses only (127.0.0.1, ::1, localhost), not {host!r}: "
                         "it shows prompts and model outputs without authentication. Reach it from another machine "
                         "through an SSH tunnel (ssh -L PORT:127.0.0.1:PORT host)")


def serve_live_report(run_dir: str | Path, port: int = 0, host: str = "127.0.0.1",
                      refresh_s: float = 5.0) -> ThreadingHTTPServer:
    """Start serving ``run_dir``'s live report in a daemon thread; returns the server (``server_port``; stop it
    with ``shutdown()`` then ``server_close()``)."""
    _check_loopback(host)
    report = LiveReport(run_dir, refresh_s)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/", "/report.html"):
                self.send_error(404, "the live report is at /")
                return
            body = report.page()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: one line per request is noise
            return

    server_class = type("LiveReportServer", (ThreadingHTTPServer,),
                        {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server = server_class((host, int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="hybridflow-live-report", daemon=True).start()
    return server
