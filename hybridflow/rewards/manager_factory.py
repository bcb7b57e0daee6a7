"""Building the reward manager from the verl-shaped config (``reward_model``, ``custom_reward_function``)."""

from __future__ import annotations

from typing import Any

from hybridflow.rewards.custom_function import ScoreFnSpec
from hybridflow.rewards.managers import REWARD_MANAGERS, RewardManager
from hybridflow.rewards.outcome import ScoringConfig

_DAPO_CTOR_KEYS = ("max_resp_len", "overlong_buffer_cfg")


def sandbox_fusion_kwargs(rm, custom: bool) -> dict[str, Any]:
    """verl's keywords for the code scorers from ``reward_model.sandbox_fusion`` (empty without a url).

    ``max_concurrent`` bounds requests in flight across the ``reward_model.num_workers`` scoring processes: each
    process gets ``max_concurrent // num_workers`` permits (a sample's test cases share them).
    """
    sf = rm.sandbox_fusion
    if not sf.url:
        return {}
    from hybridflow.sandbox.fusion_client import ConcurrencyLimit, run_code_url

    if custom:
        raise ValueError("reward_model.sandbox_fusion.url is used by the built-in code scorers only (as in verl), and "
                         "custom_reward_function.path replaces them: pass the url to your function through "
                         "reward_model.reward_kwargs.sandbox_fusion_url, or unset one of the two")
    try:
        run_code_url(sf.url)
    except ValueError as e:
        raise ValueError(f"reward_model.sandbox_fusion.url: {e}") from None
    processes = max(rm.num_workers, 1)
    if sf.max_concurrent < processes:
        raise ValueError(f"reward_model.sandbox_fusion.max_concurrent={sf.max_concurrent} is below "
                         f"reward_model.num_workers={rm.num_workers} (each scoring process needs one request in "
                         "flight): raise max_concurrent or lower num_workers")
    if sf.memory_limit_mb < 32:
        raise ValueError(f"reward_model.sandbox_fusion.memory_limit_mb={sf.memory_limit_mb} must be >= 32")
    return {"sandbox_fusion_url": sf.url, "memory_limit_mb": sf.memory_limit_mb,
            "concurrent_semaphore": ConcurrencyLimit(sf.max_concurrent // processes)}


def reward_manager_class(rm) -> type[RewardManager]:
    """The class of ``reward_model.reward_manager`` (a registered name), or with verl's
    ``reward.reward_manager.source=importlib`` the class ``module.name`` of the file/module ``module.path``."""
    if getattr(rm, "reward_loop_source", "register") == "importlib":
        from hybridflow.utils.load_object import load_object

        return load_object(str(rm.reward_loop_module_path or ""), name=rm.reward_loop_class_name,
                           key="reward.reward_manager.module.path", kind="reward manager class", expect=RewardManager)
    if rm.reward_manager not in REWARD_MANAGERS:
        raise ValueError(f"reward_model.reward_manager: {REWARD_MANAGERS.unknown_message(rm.reward_manager)}")
    return REWARD_MANAGERS.get(rm.reward_manager)


def _manager_parts(config, reward_kwargs: dict[str, Any]):
    """(manager class, scoring function spec, keywords every scorer call gets, the manager's own keywords)."""
    rm = config.reward_model
    name = rm.reward_manager
    cls = reward_manager_class(rm)
    kwargs = {**dict(rm.reward_kwargs or {}), **reward_kwargs}
    ctor = {k: kwargs.pop(k) for k in _DAPO_CTOR_KEYS if k in kwargs}
    if ctor and name != "dapo":
        raise ValueError(f"reward_model.reward_kwargs {sorted(ctor)} only apply to reward_manager=dapo, not '{name}'")
    if name == "dapo" and ctor.get("max_resp_len") is None:
        # the response-length cap the penalty ramps up to: verl's DAPO recipe passed data.max_response_length
        ctor["max_resp_len"] = config.data.max_response_length
    crf = config.custom_reward_function
    spec = ScoreFnSpec(path=crf.path, name=crf.name) if crf.path else ScoreFnSpec()
    kwargs.update(sandbox_fusion_kwargs(rm, custom=bool(crf.path)))
    return cls, spec, kwargs, ctor


def check_reward_function(config) -> None:
    """Refuse, before anything loads, a reward function that cannot take the call its manager will make
    (``RewardFunctionError`` naming the file, the function, its signature and the signature to write)."""
    cls, spec, kwargs, _ = _manager_parts(config, {})
    keywords = cls.keywords_for(kwargs)
    if config.uses_judge:  # a judge's client / router address / tokenizer, offered to the functions that take them
        from hybridflow.rewards.judge import JUDGE_KWARGS

        keywords = [*keywords, *(k for k in JUDGE_KWARGS if spec.accepts(k))]
    spec.check_call(keywords, cls.expected_signature)


def load_reward_manager(config, tokenizer, num_examine: int = 0, judge_kwargs: dict[str, Any] | None = None,
                        **reward_kwargs: Any) -> RewardManager:
    """Reward manager named by ``config.reward_model.reward_manager``.

    Reads ``config.custom_reward_function.{path,name}`` (null path = built-in scorers by data_source),
    ``config.data.reward_fn_key``, ``config.reward_model.{reward_kwargs,num_workers,timeout_s,error_score,worker_memory_mb}``,
    ``config.reward_model.sandbox_fusion.{url,max_concurrent,memory_limit_mb}`` (see :func:`sandbox_fusion_kwargs`).
    ``max_resp_len`` / ``overlong_buffer_cfg`` in the kwargs configure the ``dapo`` manager (verl passes them
    the same way); all other kwargs are forwarded to every ``compute_score`` call.  ``judge_kwargs`` (a run with
    a judge, ``rewards/judge.py``) are offered to the function and passed where it takes them.
    """
    cls, spec, kwargs, ctor = _manager_parts(config, reward_kwargs)
    rm = config.reward_model
    scoring = ScoringConfig(num_workers=rm.num_workers, timeout_s=rm.timeout_s, error_score=rm.error_score,
                            worker_memory_mb=rm.worker_memory_mb)
    if judge_kwargs and not any(spec.accepts(k) for k in judge_kwargs):
        raise ValueError(f"reward_model.rollout.name={config.reward_model.rollout.name} serves a judge, but the reward "
                         f"function {spec.describe()} takes none of {', '.join(judge_kwargs)}: add `judge` (a client: "
                         "await judge.chat(messages)) or verl's `reward_router_address` to its parameters")
    return cls(tokenizer, num_examine=num_examine, compute_score=spec, reward_fn_key=config.data.reward_fn_key,
               reward_kwargs=kwargs, scoring=scoring, offered_kwargs=judge_kwargs, **ctor)
