"""``hybridflow report RUN_DIR``: the run report of a run folder (its ``metrics.jsonl``, written by
``trainer.logger=[...,file]``): written to ``RUN_DIR/report.html``, or with ``--serve`` served live on the loopback
interface and refreshed as the run writes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hybridflow.cli.args import CommandParser

__all__ = ["main"]


def _parser() -> CommandParser:
    parser = CommandParser(prog="hybridflow report",
                           description="The run report of a run folder (outputs/<project>/<experiment> by default, "
                                       "with the 'file' logger): written once, or served live while the run writes.")
    parser.add_argument("run_dir", help="the run folder holding metrics.jsonl (and generations.jsonl)")
    parser.add_argument("--serve", action="store_true",
                        help="serve the page on http://127.0.0.1:PORT/ (loopback only), re-rendered as metrics.jsonl "
                             "grows; Ctrl-C stops")
    parser.add_argument("--port", type=int, default=8765, help="with --serve: the port (default 8765; 0: a free one)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="with --serve: a loopback address (127.0.0.1, ::1 or localhost; others are refused)")
    parser.add_argument("--refresh", type=float, default=5.0, help="with --serve: seconds between page reloads")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="with --serve: stop serving after this long (default: until Ctrl-C)")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        parser.error(f"no run folder {run_dir}")
    if args.refresh <= 0:
        parser.error(f"--refresh {args.refresh}: give a positive number of seconds")
    if not args.serve:
        from hybridflow.tracking.report import load_history, load_samples, write_report

        metrics = run_dir / "metrics.jsonl"
        if not metrics.is_file():
            parser.error(f"{metrics} does not exist: the run must log with the 'file' logger "
                         "(trainer.logger=[console,file]); --serve waits for it")
        generations = run_dir / "generations.jsonl"
        samples = load_samples(generations) if generations.is_file() else []
        print(f"wrote {write_report(run_dir, load_history(metrics), samples, title=run_dir.name)}")
        return 0
    return _serve(parser, args, run_dir)


def _serve(parser: CommandParser, args, run_dir: Path) -> int:
    from hybridflow.tracking.live_report import serve_live_report

    try:
        server = serve_live_report(run_dir, port=args.port, host=args.host, refresh_s=args.refresh)
    except ValueError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pick another --port (0: a free one)")
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"hybridflow report: serving {run_dir}'s live report at http://{host}:{server.server_port}/ "
          f"(reloads every {args.refresh:g} s; Ctrl-C stops)", flush=True)
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    print("hybridflow report: stopped", file=sys.stderr)
    return 0
