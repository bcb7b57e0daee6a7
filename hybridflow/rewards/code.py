"""Code-task scorer: run the response's program against the sample's tests in the sandbox; score = pass fraction.

The continuous pass fraction (as verl's ``prime_code`` with ``continuous=True``) gives RL a denser signal than
all-or-nothing. Ground truth is JSON (a string, as stored in verl parquet files, or an already-parsed dict):

* ``{"inputs": [...], "outputs": [...]}`` - stdin/stdout pairs (APPS / CodeContests / TACO style). Each case
  feeds ``inputs[i]`` on stdin and compares stdout with ``outputs[i]`` (trailing whitespace ignored; numbers
  compared with 1e-6 tolerance). With ``"fn_name"`` (LeetCode style), ``inputs[i]`` is the argument list of
  ``fn_name`` (a top-level function or a method of ``class Solution``) and ``outputs[i]`` its return value.
* ``{"assert": "assert f(1) == 2\\nassert f(2) == 3"}`` (a string or a list of strings) - every top-level
  ``assert`` is one test case; other statements (imports, helpers) run before each of them.

Every case is a separate sandbox run, so a crash or hang affects only that case and the program cannot see or
tamper with other cases' expectations. The verdict never comes from the program's exit code alone:
stdin/stdout and ``fn_name`` cases compare the output on the host with expected values the program never
sees; ``assert`` cases run under :mod:`hybridflow.rewards.code_harness`, which runs the asserts in a process
the program cannot reach and prints a random per-run nonce after each assert that ran to its end, checked
here. ``exit()``, ``sys.exit(0)``, ``os._exit(0)``, ``atexit``/``sys.excepthook`` exits and objects whose
``__eq__`` always answers True therefore score 0. As verl's ``compute_score(..., continuous=True)``,
the score is the pass fraction of the first :data:`MAX_SCORED_CASES` (10) cases (problems with hundreds of
cases cost ten runs), and a completion without a ```python (or untagged) fence is the program itself -- the
text before its first fence, if it has fences of another language -- except on a SandboxFusion service,
where verl scores such a completion 0.0. With ``sandbox_fusion_url`` (verl's keyword, set
from ``reward_model.sandbox_fusion.url``) the runs go to a SandboxFusion service instead of the local sandbox
(``hybridflow sandbox serve`` is one); the scoring rules are the same.
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
import contextlib
from dataclasses import dataclass, field
from typing import Callable

from hybridflow.sandbox import SandboxConfig, SandboxResult, run_python
from hybridflow.sandbox.fusion_client import run_code_remote

Runner = Callable[[str, str], SandboxResult]
HARNESS_SOURCE = (Path(__file__).parent / "code_harness.py").read_text(encoding="utf-8")
HARNESS_FAILURE = "hybridflow-harness-error:"


class CodeHarnessError(RuntimeError):
    """The test harness could not run (e.g. the sandbox refused its second process): not the program's fault."""

MAX_SCORED_CASES = 10  # verl's continuous code score looks at the first 10 test cases

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("python", "py", "python3")


def extract_code(solution_str: str) -> str | None:
    """The last ```python fenced block (or, if none is tagged python, the last untagged block)."""
    blocks = _FENCE.findall(solution_str or "")
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    untagged = [body for tag, body in blocks if not tag]
    return untagged[-1] if untagged else None


@dataclass
class _Case:
    code_suffix: str = ""
    stdin: str = ""
    expected_stdout: str | None = None
    expected_return: object = None
    compare_return: bool = False
    prelude: str = ""
    assertion: str | None = None  # an assert case: runs under the harness


@dataclass
class CodeEvalResult:
    """Per-case sandbox statuses and whether each case passed; ``score`` is the pass fraction."""

    passed: list[bool] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def _text(value) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _parse_ground_truth(ground_truth) -> dict:
    if isinstance(ground_truth, (bytes, str)):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as e:
            raise ValueError(f"code ground_truth is not valid JSON ({e.msg}); expected "
                             '{"inputs": [...], "outputs": [...]} or {"assert": "..."}') from None
    well_formed = isinstance(ground_truth, dict) and ({"inputs", "outputs"} <= set(ground_truth) or "assert" in ground_truth)
    if not well_formed:
        raise ValueError('code ground_truth must be {"inputs": [...], "outputs": [...]} (stdin/stdout pairs) or '
                         f'{{"assert": "..."}}; got {str(ground_truth)[:200]!r}')
    return ground_truth


def _io_cases(gt: dict) -> list[_Case]:
    inputs, outputs = gt["inputs"], gt["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError(f"code ground_truth: 'inputs' and 'outputs' must be lists of equal length, got "
                         f"{type(inputs).__name__}[{len(inputs)}] and {type(outputs).__name__}[{len(outputs)}]")
    fn_name = gt.get("fn_name")
    if not fn_name:
        return [_Case(stdin=_text(i), expected_stdout=_text(o)) for i, o in zip(inputs, outputs)]
    call = (
        "\n\nimport json as _json, sys as _sys\n"
        "_args = _json.loads(_sys.stdin.read())\n"
        f"_fn = getattr(Solution(), {fn_name!r}) if 'Solution' in globals() else globals()[{fn_name!r}]\n"
        "print(_json.dumps(_fn(*_args)))\n"
    )
    return [_Case(code_suffix=call, stdin=json.dumps(i if isinstance(i, list) else [i]), expected_return=o,
                     compare_return=True) for i, o in zip(inputs, outputs)]


def _assert_cases(source) -> list[_Case]:
    source = "\n".join(source) if isinstance(source, list) else str(source)
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"code ground_truth 'assert' is not valid Python: {e.msg} (line {e.lineno})") from None
    setup = [ast.get_source_segment(source, n) for n in tree.body if not isinstance(n, ast.Assert)]
    asserts = [ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.Assert)]
    if not asserts:
        raise ValueError("code ground_truth 'assert' contains no assert statement")
    prelude = "\n".join(setup)
    return [_Case(prelude=prelude, assertion=a) for a in asserts]


def _tokens_equal(a: str, b: str) -> bool:
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not math.isclose(fx, fy, rel_tol=1e-6, abs_tol=1e-6):
            return False
    return True


def stdout_matches(actual: str, expected: str) -> bool:
    """Same lines up to trailing whitespace, else same whitespace-separated tokens (numbers within 1e-6)."""
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip().splitlines())  # noqa: E731
    return norm(actual) == norm(expected) or _tokens_equal(actual, expected)


def _return_matches(stdout: str, expected) -> bool:
    lines = stdout.strip().splitlines()
    if not lines:
        return False
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return False
    # APPS stores some expected return values wrapped in a one-element list.
    return value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])


def _harness_passed(result: SandboxResult, nonce: str) -> bool:
    """An assert case passed when the harness printed this run's nonce after the assert (the exit code does
    not count: the program may have exited 0 on purpose)."""
    lines = result.stdout.splitlines()
    if any(line.startswith(HARNESS_FAILURE) for line in lines):
        raise CodeHarnessError(next(line for line in lines if line.startswith(HARNESS_FAILURE)))
    return f"{nonce} 0 pass" in lines


def _case_passed(case: _Case, result: SandboxResult, nonce: str) -> bool:
    if case.assertion is not None:
        return _harness_passed(result, nonce)
    if result.status != "pass":
        return False
    if case.compare_return:
        return _return_matches(result.stdout, case.expected_return)
    if case.expected_stdout is not None:
        return stdout_matches(result.stdout, case.expected_stdout)
    return True


def remote_runner(url: str, timeout_s: float, memory_mb: int, semaphore=None) -> Runner:
    """``(program, stdin) -> SandboxResult`` on the SandboxFusion service at ``url`` (``semaphore``: verl's
    ``concurrent_semaphore``, held around each request)."""

    def run(program: str, stdin: str) -> SandboxResult:
        with semaphore if semaphore is not None else contextlib.nullcontext():
            return run_code_remote(url, program, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)

    return run


def evaluate_code(code: str, ground_truth, timeout_s: float = 5.0, memory_mb: int = 512, max_workers: int = 2,
                  sandbox_config: SandboxConfig | None = None, runner: Runner | None = None,
                  max_cases: int | None = None) -> CodeEvalResult:
    """Run ``code`` against the cases of ``ground_truth`` (the first ``max_cases`` when given; in parallel,
    ``max_workers`` at a time).

    ``runner(program, stdin)`` runs one case; the default is the local sandbox with ``sandbox_config``.
    """
    gt = _parse_ground_truth(ground_truth)
    cases = _assert_cases(gt["assert"]) if "assert" in gt else _io_cases(gt)
    if max_cases is not None:
        cases = cases[:max_cases]
    if runner is None:
        config = sandbox_config or SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb)

        def runner(program: str, stdin: str) -> SandboxResult:  # the harness forks once (matters in audit mode)
            return run_python(program, stdin=stdin, config=config, allow_forks=int(program is HARNESS_SOURCE))

    nonces = [secrets.token_hex(16) for _ in cases]

    def run(job: tuple[_Case, str]) -> SandboxResult:
        case, nonce = job
        if case.assertion is None:
            return runner(code + case.code_suffix, case.stdin)
        return runner(HARNESS_SOURCE, json.dumps({"nonce": nonce, "code": code, "prelude": case.prelude,
                                                  "asserts": [case.assertion]}))

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(cases)))) as pool:
        results = list(pool.map(run, zip(cases, nonces)))
    passed = [_case_passed(c, r, n) for c, r, n in zip(cases, results, nonces)]
    statuses = [r.status if r.status != "pass" or ok else "fail" for r, ok in zip(results, passed)]
    return CodeEvalResult(passed=passed, statuses=statuses)


def compute_score(solution_str: str, ground_truth, extra_info: dict | None = None, *, timeout_s: float = 5.0,
                  memory_mb: int | None = None, memory_limit_mb: int | None = None, max_workers: int = 2,
                  sandbox_config: SandboxConfig | None = None, sandbox_fusion_url: str | None = None,
                  concurrent_semaphore=None, **kwargs) -> float:
    """Pass fraction of the program in ``solution_str`` on the first 10 tests in ``ground_truth`` (verl's rules).

    The program is the last ```python block (or untagged block); without one, the completion itself (locally)
    or 0.0 (on a SandboxFusion service), as verl. Keywords used: ``timeout_s`` (per case, default 5),
    ``memory_mb`` (or verl's ``memory_limit_mb``, default 512), ``max_workers`` (parallel cases, default 2),
    ``sandbox_config``, and verl's ``sandbox_fusion_url`` (run on that service) with ``concurrent_semaphore``
    (held around each request; its permits also set the parallel cases). Other keywords (reward managers
    forward ``reward_kwargs`` meant for every scorer) are not used here. Invalid ground truth raises
    ``ValueError`` (a data problem, reported by the reward manager), never a silent 0; an unreachable service
    raises ``SandboxFusionError`` (counted as a reward error).
    """
    gt = _parse_ground_truth(ground_truth)  # validate even when there is no code, so bad data is noticed
    code = extract_code(solution_str)
    if code is None:
        if sandbox_fusion_url:
            return 0.0
        code = (solution_str or "").split("```")[0]
    memory_mb = memory_mb or memory_limit_mb or 512
    runner = None
    if sandbox_fusion_url:
        runner = remote_runner(sandbox_fusion_url, timeout_s, memory_mb, concurrent_semaphore)
        max_workers = getattr(concurrent_semaphore, "permits", max_workers)
    return evaluate_code(code, gt, timeout_s=timeout_s, memory_mb=memory_mb, max_workers=max_workers,
                         sandbox_config=sandbox_config, runner=runner, max_cases=MAX_SCORED_CASES).score


__all__ = ["MAX_SCORED_CASES", "CodeEvalResult", "CodeHarnessError", "compute_score", "evaluate_code", "extract_code",
           "remote_runner", "stdout_matches"]
