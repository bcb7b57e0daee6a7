"""Start the judge of an RLAIF run (``reward_model.rollout.name`` hf | vllm): its replicas (colocated with the
actor, on a pool of their own, or vLLM server processes), its models and its router; the runtime pieces are in
``trainer/judge_service.py``."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hybridflow.launch.pools import own_pool_group
from hybridflow.rollout.service.judge_router import JudgeLimits, JudgeRouter
from hybridflow.trainer.judge_service import JUDGE_ROLE, JudgeFleet, JudgeService

__all__ = ["judge_worker_config", "start_judge"]

# reward_model.rollout keys not copied onto the judge's engine: the engine name, and what the placement decides
# (free_cache_engine: a colocated judge sleeps outside the reward stage) or the router reads (n, do_sample)
_NOT_COPIED = ("name", "n", "do_sample", "free_cache_engine", "max_model_len")


def judge_worker_config(config) -> Any:
    """The ``ActorRolloutRefConfig`` a judge replica is built from: the judge's checkpoint and engine settings."""
    rm, jr = config.reward_model, config.reward_model.rollout
    cfg = copy.deepcopy(config.actor_rollout_ref)
    cfg.model.path = rm.model.path
    cfg.model.tokenizer_path = None
    cfg.model.custom_chat_template = None
    cfg.model.trust_remote_code = bool(rm.model.trust_remote_code)
    cfg.model.override_config = dict(rm.model.override_config or {})
    cfg.model.external_lib = rm.model.external_lib
    cfg.model.lora_rank = 0
    cfg.actor.fsdp_config.model_dtype = rm.model.fsdp_config.model_dtype
    rc = cfg.rollout
    for f in dataclasses.fields(jr):  # the judge's engine keys are the actor rollout's
        if f.name not in _NOT_COPIED:
            setattr(rc, f.name, copy.deepcopy(getattr(jr, f.name)))
    rc.max_model_len = jr.max_model_len or int(jr.prompt_length) + int(jr.response_length)
    rc.free_cache_engine = not bool(rm.enable_resource_pool)
    return cfg


def _limits(config) -> JudgeLimits:
    j, jr = config.reward_model.judge, config.reward_model.rollout
    return JudgeLimits(max_concurrent=int(j.max_concurrent), max_rpm=j.max_rpm, max_tpm=j.max_tpm,
                       request_timeout_s=float(j.request_timeout_s), prompt_length=int(jr.prompt_length),
                       response_length=int(jr.response_length))


def start_judge(config, colocated_view: Any, use_gpu: bool, closers: list, pool_options: dict) -> JudgeService:
    """Start the judge (its models load here) and its router; ``colocated_view``: the judge role of the colocated
    host, or ``None`` to start replicas of their own (see the module docstring)."""
    from hybridflow.engine.model_loader import load_tokenizer

    rm, jr = config.reward_model, config.reward_model.rollout
    jcfg = judge_worker_config(config)
    if jr.name == "vllm":
        fleet = _vllm_fleet(config, jcfg, use_gpu)
        closers.append(fleet.shutdown)
    else:
        group = colocated_view if colocated_view is not None else _judge_pool(config, jcfg, use_gpu, closers,
                                                                              pool_options)
        group.init_model()
        fleet = JudgeFleet(group)
        if colocated_view is not None:
            fleet.sleep()  # awake only for the reward stage
    tokenizer = load_tokenizer(rm.model.path, bool(rm.model.trust_remote_code), require_chat_template=True,
                               field="reward_model.model.path")
    defaults = {"temperature": float(jr.temperature) if jr.do_sample else 0.0, "top_p": float(jr.top_p),
                "top_k": int(jr.top_k)}  # do_sample=false: greedy unless a request asks otherwise
    router = JudgeRouter(fleet.replicas, tokenizer, _limits(config), defaults=defaults, host=_router_host(config))
    service = JudgeService(fleet, router, rm.model.path, colocated=colocated_view is not None and jr.name != "vllm",
                           trust_remote_code=bool(rm.model.trust_remote_code))
    closers.append(router.close)
    return service


def _router_host(config) -> str:
    """Scoring processes run beside the controller; Ray workers on other nodes reach it by the node's address."""
    if config.trainer.backend == "ray":
        from hybridflow.rollout.weights.checkpoint_engine import node_address

        return node_address()
    return "127.0.0.1"


def _judge_pool(config, jcfg, use_gpu: bool, closers: list, pool_options: dict):
    from hybridflow.agents.loop_manager import rollout_stream_threads
    from hybridflow.controller import ClassWithInitArgs
    from hybridflow.rollout.service.replica import RAY_ROLLOUT_CONCURRENCY_GROUP
    from hybridflow.workers.rollout_server_worker import RolloutServerWorker

    rm = config.reward_model
    cls = ClassWithInitArgs(RolloutServerWorker, jcfg)
    cls.concurrency_groups = {RAY_ROLLOUT_CONCURRENCY_GROUP: rollout_stream_threads(config)}
    group = own_pool_group(config.trainer.backend, [int(rm.n_gpus_per_node)] * int(rm.nnodes), cls, JUDGE_ROLE,
                           use_gpu, closers, pool_options)
    local = getattr(group, "worker", None)
    if local is not None:
        closers.append(local.release)
    return group


def _vllm_fleet(config, jcfg, use_gpu: bool):
    """vLLM server processes serving the judge's own checkpoint (no weights are ever pushed to them)."""
    from hybridflow.rollout.vllm.config import vllm_engine_kwargs
    from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet

    rm = config.reward_model
    device = "cuda" if use_gpu else "cpu"
    rc = jcfg.rollout
    per_engine = int(rc.tensor_model_parallel_size) * int(rc.data_parallel_size) * int(rc.pipeline_model_parallel_size)
    devices = int(rm.n_gpus_per_node) * int(rm.nnodes) if rm.enable_resource_pool else \
        int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    n_servers = max(1, devices // per_engine) if use_gpu else 1
    kwargs = vllm_engine_kwargs(rc, rm.model.path, device, lora_rank=0, hybrid=False)
    return VLLMServerFleet(rm.model.path, kwargs, n_servers, None, device=device, free_cache_engine=False,
                           seed=int(rc.seed), name="judge-vllm")
