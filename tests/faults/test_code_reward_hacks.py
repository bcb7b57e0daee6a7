"""Code rewards cannot be gamed: every known way for a program to look as if it passed scores 0 (issue 24).

Each hack is scored in every isolation mode this machine has and through `hybridflow sandbox serve`; a correct
program scores 1 in the same runs, so a 0 is the hack failing, not the harness.
"""

from __future__ import annotations

import json

import pytest

from hybridflow.rewards.code import HARNESS_SOURCE, compute_score, evaluate_code, extract_code
from hybridflow.sandbox import SandboxConfig, available_isolations, run_python
from hybridflow.sandbox.http_service import serve_in_thread

GT = {"assert": "import math\nassert double(3) == 6\nassert double(-2) == -4\nassert math.isclose(double(0.5), 1.0)"}
CORRECT = "def double(x):\n    return 2 * x\n"
WRONG = "def double(x):\n    return x\n"
HACKS = {
    "exit()": WRONG + "exit()\n",
    "quit()": WRONG + "quit()\n",
    "sys.exit(0)": "import sys\n" + WRONG + "sys.exit(0)\n",
    "raise SystemExit": WRONG + "raise SystemExit(0)\n",
    "os._exit(0)": "import os\n" + WRONG + "os._exit(0)\n",
    "atexit exit": "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG,
    "excepthook exit": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n" + WRONG,
    "__eq__ always True": ("class Anything:\n    def __eq__(self, other):\n        return True\n"
                           "    def __ne__(self, other):\n        return False\n    def __bool__(self):\n"
                           "        return True\n    __hash__ = object.__hash__\n"
                           "def double(x):\n    return Anything()\n"),
    "__eq__ on a subclass of int": ("class Int(int):\n    def __eq__(self, other):\n        return True\n"
                                    "    __hash__ = int.__hash__\ndef double(x):\n    return Int(0)\n"),
    "patch AssertionError": "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n" + WRONG,
    "patch math.isclose": "import math\nmath.isclose = lambda *a, **k: True\n" + WRONG,
    "print fake verdicts": "import sys\nfor i in range(3):\n    print(f'0 {i} pass')\n" + WRONG,
    "kill the test process": "import os, signal\n" + WRONG + "os.kill(os.getppid(), signal.SIGKILL)\n",
    "read the test from the parent": ("import os\nppid = os.getppid()\n"
                                      "for name in ('fd/0', 'mem', 'environ'):\n    p = '/proc/%d/%s' % (ppid, name)\n"
                                      "    try:\n        print(open(p, 'rb').read(200))\n"
                                      "    except Exception as e:\n        print(type(e).__name__)\n" + WRONG),
    "walk frames for the nonce": ("import sys\nf = sys._getframe()\nwhile f.f_back:\n    f = f.f_back\n"
                                  "print(sorted(f.f_globals))\n" + WRONG),
    "hang": "import time\ntime.sleep(60)\n" + WRONG,
}
MODES = available_isolations()


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


@pytest.mark.parametrize("mode", MODES)
def test_every_hack_scores_zero_and_a_correct_program_scores_one(mode):
    config = SandboxConfig(isolation=mode, timeout_s=3.0, memory_mb=256)
    assert compute_score(fenced(CORRECT), GT, sandbox_config=config) == 1.0
    for name, code in HACKS.items():
        result = evaluate_code(extract_code(fenced(code)), GT, sandbox_config=config, max_workers=3)
        assert result.score == 0.0, (mode, name, result)


def test_a_partly_right_program_gets_its_share():
    half = "def double(x):\n    return 2 * x if x > 0 else x\n"  # right for 3 and 0.5, wrong for -2
    assert compute_score(fenced(half), GT) == pytest.approx(2 / 3)


def test_hacks_score_zero_through_the_service_too():
    server, url = serve_in_thread(workers=2, max_timeout_s=3, max_memory_mb=256)
    try:
        assert compute_score(fenced(CORRECT), GT, sandbox_fusion_url=url) == 1.0
        for name in ("exit()", "os._exit(0)", "__eq__ always True", "print fake verdicts"):
            assert compute_score(fenced(HACKS[name]), GT, sandbox_fusion_url=url) == 0.0, name
    finally:
        server.shutdown()
        server.server_close()


def test_the_verdict_needs_this_runs_nonce():
    """A pass line with another nonce (or none) is not a pass: the program would have to read the nonce, which
    reaches the test process only after the program process was split off."""
    job = {"nonce": "n" * 32, "code": CORRECT, "prelude": "", "asserts": ["assert double(2) == 4"]}
    result = run_python(HARNESS_SOURCE, stdin=json.dumps(job), allow_forks=1)
    assert f"{'n' * 32} 0 pass" in result.stdout.splitlines()
    job["code"] = "print('m' * 32 + ' 0 pass')\n" + WRONG
    result = run_python(HARNESS_SOURCE, stdin=json.dumps(job), allow_forks=1)
    assert not any(line.endswith(" 0 pass") for line in result.stdout.splitlines()), result
    assert "m" * 32 in result.stderr  # the program's prints go to stderr, never to the verdict stream


def test_program_values_are_compared_as_plain_data():
    gt = {"assert": ["assert pair(1) == (1, 1)", "assert sorted(gen(3)) == [0, 1, 2]",
                     "assert words()['a'] == {1}",
                     "assert Solution().twoSum([2, 7, 11], 9) == [0, 1]", "assert maybe() is None",
                     "try:\n    boom()\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError",
                     "assert ratio() != ratio()"]}
    code = ("def pair(x):\n    return (x, x)\ndef gen(n):\n    yield from reversed(range(n))\n"
            "def words():\n    return {'a': {1}}\nclass Solution:\n    def twoSum(self, nums, t):\n"
            "        return [0, 1]\ndef maybe():\n    return None\ndef boom():\n    raise ValueError('no')\n"
            "def ratio():\n    return float('nan')\n")
    result = evaluate_code(code, gt)
    assert result.passed == [True] * 6, result
    setup_catches = {"assert": "try:\n    boom()\nexcept ValueError:\n    ok = 1\nassert ok == 1"}
    assert evaluate_code(code, setup_catches).score == 1


@pytest.mark.slow
def test_grpo_on_a_code_task_never_rewards_exit(tmp_path):
    """A policy warmed up to answer with `exit()` half the time gets 0 for every such answer under GRPO, and
    moves towards the correct program (issue 24: `exit()` scored 1.0 before)."""
    from code_task_run import EXIT_PROGRAM, FENCE_CLOSE, FENCE_OPEN, SOLVE_PROGRAM, exit_fraction, run_code_task

    dumps = run_code_task(tmp_path, steps=6)
    for step, rows in dumps.items():
        for row in rows:
            if EXIT_PROGRAM in row["output"]:
                assert row["score"] == 0.0, (step, row)
            elif row["output"] == FENCE_OPEN + SOLVE_PROGRAM + FENCE_CLOSE:
                assert row["score"] == 1.0, (step, row)
    first, last = exit_fraction(dumps[min(dumps)]), exit_fraction(dumps[max(dumps)])
    assert first > 0.2, f"the warm-up did not teach exit() (fraction {first:.2f})"
    assert last < first - 0.15, f"exit() fraction {first:.2f} -> {last:.2f}: GRPO did not move away from it"
