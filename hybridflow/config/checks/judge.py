"""Rules for a reward model on the rollout service (a judge, ``reward_model.rollout.*``, verl 0.9's
``reward.reward_model.rollout.*``) and for the reward model's own pool (``reward_model.enable_resource_pool``): every
key acts in the run that reads it, or is refused.

The judge's engine keys are the actor rollout's (``trainer/judge_service.py`` copies them onto the judge replicas),
so a key the key policy refuses or finds inert for ``actor_rollout_ref.rollout`` is refused or noted here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridflow.config.key_policy import INERT, REFUSED, default_of, expand

__all__ = ["check_judge", "JUDGE_ENGINES", "JUDGE_REQUEST_KEYS"]

JUDGE_ENGINES = ("hf", "vllm")
# read by the router as the defaults of a request (not engine settings)
JUDGE_REQUEST_KEYS = ("temperature", "top_p", "top_k", "do_sample", "prompt_length", "response_length")
_VLLM_ONLY = ("enforce_eager", "tensor_model_parallel_size", "load_format", "engine_kwargs", "cudagraph_capture_sizes",
              "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching", "disable_log_stats",
              "data_parallel_size", "expert_parallel_size", "pipeline_model_parallel_size", "quantization",
              "gpu_memory_utilization", "scheduling_policy")


def _actor_rule(leaf: str, rules) -> Any:
    """The key-policy rule of the actor rollout's spelling of a judge key (``reward_model.rollout.X``)."""
    key = "actor_rollout_ref.rollout." + leaf[len("reward_model.rollout."):]
    for rule in rules:
        if any(key == k or key.startswith(k + ".") for k in expand(rule.key)):
            return rule
    return None


def _changed(cfg: Any) -> list[str]:
    """The judge keys set away from their defaults, as ``rollout.X`` / ``judge.X`` (``name`` not counted)."""
    node = cfg.reward_model.rollout  # a typed node: compared field by field with the defaults file
    out = [f"rollout.{f.name}" for f in dataclasses.fields(node)
           if f.name != "name" and getattr(node, f.name) != default_of(f"reward_model.rollout.{f.name}")]
    out += [f"judge.{k}" for k in ("max_concurrent", "max_rpm", "max_tpm", "request_timeout_s")
            if getattr(cfg.reward_model.judge, k) != default_of(f"reward_model.judge.{k}")]
    return out


def check_judge(cfg: Any, errors: list[str], notes: list[str]) -> None:
    rm = cfg.reward_model
    name = rm.rollout.name
    changed = _changed(cfg)
    if name is None:
        for key in changed:
            errors.append(f"reward_model.{key} configures a judge served on the rollout service, which this run does not "
                          "start: set reward_model.rollout.name=hf (or vllm) with reward_model.enable=true, or drop it")
    elif not cfg.custom_reward_function.path:
        # verl's reward loop: a served RM without a reward function is discriminative (vLLM's classify endpoint)
        notes.append(f"reward_model.rollout.name={name} without custom_reward_function: reward_model.model.path is a "
                     "discriminative (sequence-classification) reward model, scored by the reward-model worker (the "
                     "same score vLLM's classify endpoint returns); the engine keys reward_model.rollout.* are not read "
                     "for it. A generative judge needs a reward function that asks it (custom_reward_function.path).")
        if rm.rollout.name not in JUDGE_ENGINES:
            errors.append(f"reward_model.rollout.name={name!r}: choose hf or vllm")
        for key in [k for k in changed if k.startswith("judge.")]:
            errors.append(f"reward_model.{key} limits requests to a generative judge; this run's reward model is "
                          "discriminative (no custom_reward_function), so nothing reads it")
    else:
        _check_served(cfg, name, changed, errors, notes)
    pool = int(rm.n_gpus_per_node) * int(rm.nnodes)
    if rm.enable_resource_pool:
        if not rm.enable:
            errors.append("reward_model.enable_resource_pool=true but reward_model.enable=false: there is no reward model "
                          "to place on a pool of its own")
        elif cfg.trainer.backend == "ray" and pool < 1:
            errors.append(f"reward_model.enable_resource_pool=true needs processes: reward_model.n_gpus_per_node x nnodes "
                          f"is {rm.n_gpus_per_node} x {rm.nnodes}; set both (e.g. n_gpus_per_node=1 nnodes=1)")
        if cfg.trainer.recipe == "prime":
            errors.append("reward_model.enable_resource_pool=true with trainer.recipe=prime: PRIME's implicit PRM trains "
                          "beside the actor; drop enable_resource_pool")
    elif rm.n_gpus_per_node != default_of("reward_model.n_gpus_per_node") or \
            rm.nnodes != default_of("reward_model.nnodes"):
        errors.append(f"reward_model.n_gpus_per_node={rm.n_gpus_per_node} / nnodes={rm.nnodes} size the reward model's "
                      "own pool, read only with reward_model.enable_resource_pool=true")


def _check_served(cfg: Any, name: str, changed: list[str], errors: list[str], notes: list[str]) -> None:
    rm = cfg.reward_model
    if name not in JUDGE_ENGINES:
        errors.append(f"reward_model.rollout.name={name!r}: the judge is served by hf (runs everywhere, CPU included) "
                      "or vllm; SGLang has no CPU build and its adapter is not verified for judges")
    if not rm.enable:
        errors.append(f"reward_model.rollout.name={name} serves the generative reward model reward_model.model.path: "
                      "set reward_model.enable=true (verl: reward.reward_model.enable=true)")
    if cfg.trainer.recipe == "prime":
        errors.append("reward_model.rollout.name with trainer.recipe=prime: PRIME's reward model is its implicit PRM, "
                      "trained beside the actor, not a judge")
    if rm.timeout_s <= rm.judge.request_timeout_s:
        errors.append(f"reward_model.timeout_s={rm.timeout_s} must exceed reward_model.judge.request_timeout_s="
                      f"{rm.judge.request_timeout_s}: a reward function waits for the judge inside its own time limit "
                      "(raise timeout_s, or lower request_timeout_s)")
    if rm.launch_reward_fn_async and not rm.enable_resource_pool:
        errors.append("reward_model.launch_reward_fn_async=true with a judge colocated with the actor: the judge would "
                      "run beside the actor's log-prob passes on the same devices; put it on its own pool "
                      "(reward_model.enable_resource_pool=true) or score synchronously")
    if rm.rollout.prompt_length <= 0 or rm.rollout.response_length <= 0:
        errors.append("reward_model.rollout.prompt_length and response_length must be positive (judge tokens in / out)")
    if rm.judge.request_timeout_s <= 0:
        errors.append(f"reward_model.judge.request_timeout_s={rm.judge.request_timeout_s} must be > 0")
    _check_engine_keys(cfg, name, changed, errors, notes)


def _check_engine_keys(cfg: Any, name: str, changed: list[str], errors: list[str], notes: list[str]) -> None:
    rm = cfg.reward_model
    if int(rm.rollout.n) != 1:
        errors.append(f"reward_model.rollout.n={rm.rollout.n}: the judge answers each request once (as verl's reward "
                      "loop does); to ask it several times, send several requests from the reward function")
    if rm.rollout.max_model_len is not None and \
            int(rm.rollout.max_model_len) < int(rm.rollout.prompt_length) + int(rm.rollout.response_length):
        errors.append(f"reward_model.rollout.max_model_len={rm.rollout.max_model_len} is shorter than prompt_length + "
                      f"response_length = {int(rm.rollout.prompt_length) + int(rm.rollout.response_length)}: raise it "
                      "or drop it (null: their sum)")
    if not rm.enable_resource_pool and not rm.rollout.free_cache_engine and name == "hf":
        errors.append("reward_model.rollout.free_cache_engine=false with a judge colocated with the actor: it sleeps "
                      "outside the reward stage, freeing its cache; put it on its own pool "
                      "(reward_model.enable_resource_pool=true) to keep it awake")
    for key in changed:
        leaf = f"reward_model.{key}"
        if not key.startswith("rollout."):
            continue
        refused = _actor_rule(leaf, REFUSED)
        if refused is not None:
            errors.append(f"{leaf} is not supported for the judge either: {refused.reason}")
            continue
        inert = _actor_rule(leaf, INERT)
        if inert is not None:
            notes.append(f"{leaf} has no effect on the judge: {inert.reason}")
    if name == "hf":
        unread = [k for k in changed if k.split(".", 1)[-1] in _VLLM_ONLY]
        if unread:
            notes.append(f"reward_model.{', '.join(unread)}: read by the vllm judge only; the hf engine serves the "
                         "judge without them")
