"""verl's code scorer rules (``default_compute_score`` for codecontests / apps / codeforces / taco).

verl (``reward_score.prime_code``, ``continuous=True``): a completion without a ```python fence is the program,
and the score is the pass fraction of the first 10 test cases; on a SandboxFusion service an unfenced
completion scores 0.0 (``reward_score.sandbox_fusion``).
"""

from __future__ import annotations

import json

import pytest

from hybridflow.rewards.scorers import default_compute_score
from hybridflow.tools.sandbox_fusion_client import ConcurrencyLimit
from hybridflow.tools.sandbox_server import serve_in_thread

PROGRAM = "n = int(input())\nprint(n * 2)\n"


def cases(n: int, wrong: set[int] = frozenset()) -> str:
    return json.dumps({"inputs": [f"{i}\n" for i in range(n)],
                       "outputs": [f"{2 * i + (1 if i in wrong else 0)}\n" for i in range(n)]})


@pytest.mark.parametrize("source", ["codecontests", "apps", "codeforces", "taco"])
def test_an_unfenced_completion_is_the_program(source):
    assert default_compute_score(source, PROGRAM, cases(3)) == 1.0
    assert default_compute_score(source, f"```python\n{PROGRAM}```", cases(3)) == 1.0


def test_text_before_a_fence_of_another_language_is_the_program():
    assert default_compute_score("codecontests", f"{PROGRAM}```text\nnot code\n```", cases(2)) == 1.0
    assert default_compute_score("codecontests", "I would write:\n```bash\necho 0\n```", cases(2)) == 0.0


def test_only_the_first_ten_cases_count():
    # 12 cases, the 11th and 12th expect wrong answers: verl's continuous score looks at the first 10 only.
    assert default_compute_score("codecontests", PROGRAM, cases(12, wrong={10, 11})) == 1.0
    # a failure among the first ten: 9 of 10, not 11 of 12
    assert default_compute_score("codecontests", PROGRAM, cases(12, wrong={3})) == pytest.approx(0.9)


def test_on_a_sandbox_service_an_unfenced_completion_scores_zero():
    srv, url = serve_in_thread(workers=2, max_timeout_s=5, max_memory_mb=512)
    try:
        kwargs = dict(sandbox_fusion_url=url, concurrent_semaphore=ConcurrencyLimit(2), memory_limit_mb=256)
        assert default_compute_score("codecontests", PROGRAM, cases(2), **kwargs) == 0.0
        fenced = default_compute_score("codecontests", f"```python\n{PROGRAM}```", cases(12, wrong={11}), **kwargs)
        assert fenced == 1.0 and srv.service.programs_run == 10  # ten cases ran, the 12th never did
    finally:
        srv.shutdown()
        srv.server_close()
