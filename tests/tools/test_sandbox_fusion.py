"""SandboxFusion API: `hybridflow sandbox serve`, the client, code rewards and the code tool through it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from hybridflow.rewards.code import compute_score
from hybridflow.rewards.scorers import default_compute_score
from hybridflow.tools import CodeInterpreterTool, ToolExecutor
from hybridflow.sandbox.fusion_client import ConcurrencyLimit, SandboxFusionError, _split_token, run_code_remote
from hybridflow.sandbox.http_service import serve_in_thread

ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
IO = json.dumps({"inputs": ["1 2", "3 4", "5 5"], "outputs": ["3", "7", "11"]})  # the last case is wrong on purpose


@pytest.fixture(scope="module")
def served():
    srv, url = serve_in_thread(workers=2, max_timeout_s=5, max_memory_mb=512)
    yield srv, url
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def server(served):
    return served[1]


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    url, token = _split_token(url)
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json",
                                                                            "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_run_code_api_shapes(server):
    status, ok = post(server, {"code": "print(input()[::-1])", "stdin": "abc", "language": "python",
                               "run_timeout": 5, "compile_timeout": 5, "memory_limit_MB": 256, "files": {},
                               "fetch_files": []})
    assert status == 200 and ok["status"] == "Success" and ok["compile_result"] is None
    assert ok["run_result"]["status"] == "Finished" and ok["run_result"]["return_code"] == 0
    assert ok["run_result"]["stdout"] == "cba\n" and ok["run_result"]["execution_time"] > 0
    _, failed = post(server, {"code": "raise SystemExit(3)"})
    assert failed["status"] == "Failed" and failed["run_result"]["return_code"] == 3
    _, slow = post(server, {"code": "while True: pass", "run_timeout": 0.5})
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    _, cpp = post(server, {"code": "int main(){}", "language": "cpp"})
    assert cpp["status"] == "SandboxError" and "python only" in cpp["message"]
    code, bad = post(server, b"{not json")
    assert code == 400 and bad["status"] == "SandboxError"
    code, _ = post(server, {"stdin": "x"})
    assert code == 400
    with urllib.request.urlopen(_split_token(server)[0].replace("/run_code", "/v1/ping"), timeout=10) as r:
        assert r.read() == b"pong"


def test_client_maps_the_answer_onto_sandbox_results(server):
    assert run_code_remote(server, "print(6*7)").stdout == "42\n"
    assert run_code_remote(server, "import sys; sys.exit(2)").status == "fail"
    assert run_code_remote(server, "while True: pass", timeout_s=0.5).status == "timeout"
    # the base URL works too, and the server caps run_timeout at its --max-timeout (5 s here)
    base = server.rsplit("/", 1)[0]
    assert run_code_remote(base, "print(1)").status == "pass"
    with pytest.raises(SandboxFusionError, match="unreachable after 2 attempt"):
        run_code_remote("http://127.0.0.1:9/run_code", "print(1)", max_retries=2)


def test_code_reward_through_the_service_equals_local(served, server):
    local = compute_score(ADD, IO)
    before = served[0].service.programs_run
    remote = default_compute_score("codecontests", ADD, IO, sandbox_fusion_url=server,
                                   concurrent_semaphore=ConcurrencyLimit(2), memory_limit_mb=256)
    assert local == remote == pytest.approx(2 / 3)
    assert served[0].service.programs_run - before == 3  # one program per test case ran on the service
    # the keywords reach code scorers only; gsm8k's scorer would reject them
    assert default_compute_score("openai/gsm8k", "#### 3", "3", sandbox_fusion_url=server) == 1.0
    with pytest.raises(SandboxFusionError):
        default_compute_score("apps", ADD, IO, sandbox_fusion_url="http://127.0.0.1:9/run_code")


def test_code_tool_through_the_service(server):
    tool = CodeInterpreterTool(config={"sandbox_fusion_url": server, "rate_limit": 2, "default_timeout": 2})
    ex = ToolExecutor([tool], max_tool_response_length=1000)

    async def go():
        return await asyncio.gather(ex.call("code_interpreter", {"code": "print(sum(range(10)))"}),
                                    ex.call("code_interpreter", {"code": "1/0"}),
                                    ex.call("code_interpreter", {"code": "while True: pass"}))

    ok, crash, slow = asyncio.run(go())
    assert ok.text == "45" and ok.metrics["passed"] == 1.0
    assert "ZeroDivisionError" in crash.text and "time limit exceeded" in slow.text
    down = CodeInterpreterTool(config={"sandbox_fusion_url": "http://127.0.0.1:9/run_code"})
    out = asyncio.run(ToolExecutor([down]).call("code_interpreter", {"code": "print(1)"}))
    assert out.error_kind == "tool_exception" and "unreachable" in out.text


def test_cli_serves(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, "-m", "hybridflow", "sandbox", "serve", "--port", "0", "--workers", "1"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "serving the SandboxFusion API on http://127.0.0.1:" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        with pytest.raises(SandboxFusionError, match="401.*token"):  # a token is required
            run_code_remote(url, "print('served')", max_retries=1)
        token_line = proc.stdout.readline()
        assert token_line.startswith("hybridflow sandbox: token "), token_line
        url_with_token = token_line.split("sandbox_fusion.url=", 1)[1].split(" ", 1)[0]
        assert run_code_remote(url_with_token, "print('served')").stdout == "served\n"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
