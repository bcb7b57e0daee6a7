"""Built-in rule scorers, dispatched by ``data_source`` as verl's ``default_compute_score`` does.

Each entry of :data:`SCORERS` maps a data source (or, for names ending in ``*``, a prefix) to a function
``f(solution_str, ground_truth, **kwargs) -> float | dict``. Users add their own through
``custom_reward_function.path`` (see :mod:`hybridflow.rewards.custom_function`) or by registering here.
"""

from __future__ import annotations

from typing import Any, Callable

from hybridflow.rewards.scorers import countdown, geo3k, gsm8k, math_dapo, math_reward, synthetic
from hybridflow.utils.registry import Registry

SCORERS: Registry[Callable[..., Any]] = Registry("reward scorer (data_source)")

SCORERS.register("openai/gsm8k", gsm8k.compute_score)
for _name in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
    SCORERS.register(_name, math_reward.compute_score)
for _name in ("math_dapo", "math", "math_dapo_reasoning", "aime*"):
    SCORERS.register(_name, math_dapo.compute_score)
SCORERS.register("countdown", countdown.compute_score)
for _name in ("synthetic/addition", "synthetic/addition_fixed", "synthetic/reverse", "synthetic/sort"):
    SCORERS.register(_name, synthetic.exact_match)
SCORERS.register("synthetic/countdown", synthetic.countdown_lite)
SCORERS.register("synthetic/multiplication", synthetic.final_line_match)
for _name in ("synthetic/vision_shape_color", "synthetic/vision_shape_count"):
    SCORERS.register(_name, synthetic.exact_match)
SCORERS.register(geo3k.DATA_SOURCE, geo3k.compute_score)


def _code_score(solution_str: str, ground_truth: Any, **kwargs: Any) -> float:
    """Pass fraction of the response's program in the sandbox (imported on first use: it starts processes)."""
    from hybridflow.rewards.code import compute_score

    return compute_score(solution_str, ground_truth, **kwargs)


CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
for _name in CODE_SOURCES:
    SCORERS.register(_name, _code_score)


def _lookup(data_source: str) -> Callable[..., Any]:
    if data_source in SCORERS:
        return SCORERS.get(data_source)
    for name, fn in SCORERS.items():
        if name.endswith("*") and data_source.startswith(name[:-1]):
            return fn
    raise NotImplementedError(
        f"No built-in reward scorer for data_source '{data_source}'. Built-in sources: "
        f"{', '.join(SCORERS.names())}. Point custom_reward_function.path (and .name) at a Python file defining "
        "compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)."
    )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
    sandbox_fusion_url: str | None = None, concurrent_semaphore: Any = None, memory_limit_mb: int | None = None,
    **kwargs: Any,
) -> float | dict:
    """Score one response with the built-in scorer for ``data_source`` (verl's signature and names).

    ``sandbox_fusion_url`` / ``concurrent_semaphore`` / ``memory_limit_mb`` reach the code scorers only (as in
    verl): their programs then run on that SandboxFusion service instead of the local sandbox.  A row the
    built-in scorers cannot score -- an unknown ``data_source``, no ground truth -- raises, so the reward manager
    counts it as a reward error instead of a silent 0.
    """
    if ground_truth is None:  # every built-in scorer compares with it: a None would score 0 without a word
        raise ValueError(
            f"the row has no ground truth (reward_model.ground_truth is None) for data_source '{data_source}', so the "
            "built-in scorer cannot score it; fill reward_model.ground_truth in the data, or score with "
            "custom_reward_function.path"
        )
    if sandbox_fusion_url and str(data_source) in CODE_SOURCES:
        kwargs.update(sandbox_fusion_url=sandbox_fusion_url, concurrent_semaphore=concurrent_semaphore)
        if memory_limit_mb is not None:
            kwargs["memory_limit_mb"] = memory_limit_mb
    return _lookup(str(data_source))(solution_str, ground_truth, **kwargs)


__all__ = ["CODE_SOURCES", "SCORERS", "default_compute_score"]
