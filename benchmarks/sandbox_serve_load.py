"""200 clients at once against `hybridflow sandbox serve`: how many are answered, reset, refused, timed out.

Each client opens its own connection at the same moment (a barrier), POSTs a tiny program to /run_code with
no retry, and records the outcome and its latency. The server runs in its own process, started the way a
user starts it. ``--tree DIR`` runs the server from another checkout (e.g. the code before issue 24's fix, whose
server has no token) to compare.

Run: ``.venv/bin/python benchmarks/sandbox_serve_load.py [--clients 200] [--workers 4] [--tree DIR]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_server(tree: Path, workers: int) -> tuple[subprocess.Popen, int, str | None]:
    env = dict(os.environ, PYTHONPATH=str(tree), HYBRIDFLOW_SANDBOX_TOKEN="bench-token")
    proc = subprocess.Popen([sys.executable, "-m", "hybridflow", "sandbox", "serve", "--port", "0",
                             "--workers", str(workers)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, cwd=tree)
    line = proc.stdout.readline()
    port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    token_line = proc.stdout.readline() if "--token" in subprocess.run(
        [sys.executable, "-m", "hybridflow", "sandbox", "serve", "--help"], capture_output=True, text=True,
        env=env, cwd=tree).stdout else ""
    return proc, port, ("bench-token" if token_line else None)


def load(port: int, token: str | None, clients: int) -> dict:
    barrier = threading.Barrier(clients)
    outcomes: list[tuple[str, float]] = [("", 0.0)] * clients
    body = json.dumps({"code": "print(sum(range(10)))", "language": "python", "run_timeout": 10}).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"

    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        barrier.wait()
        start = time.monotonic()
        try:
            conn.request("POST", "/run_code", body=body, headers=headers)
            resp = conn.getresponse()
            answer = json.loads(resp.read())
            ok = resp.status == 200 and answer.get("run_result", {}).get("stdout") == "45\n"
            outcomes[i] = ("ok" if ok else f"http {resp.status}", time.monotonic() - start)
        except Exception as e:
            outcomes[i] = (type(e).__name__, time.monotonic() - start)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    kinds = sorted({k for k, _ in outcomes})
    lat = sorted(s for k, s in outcomes if k == "ok")
    return {"clients": clients, "wall_s": round(wall, 2), "outcomes": {k: sum(1 for o, _ in outcomes if o == k)
                                                                      for k in kinds},
            "latency_s": {"p50": round(statistics.median(lat), 2) if lat else None,
                          "p95": round(lat[int(0.95 * (len(lat) - 1))], 2) if lat else None,
                          "max": round(lat[-1], 2) if lat else None}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose server to run")
    args = parser.parse_args()
    proc, port, token = start_server(args.tree.resolve(), args.workers)
    try:
        result = load(port, token, args.clients)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result.update(tree=str(args.tree), workers=args.workers, token=bool(token))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
