"""A generative reward model (judge) on the rollout service: its fleet, its router, and the reward functions
that ask it (started by ``hybridflow/launch/judge.py``) (``reward_model.rollout.name`` hf | vllm, verl's GenRM / reward loop).

* **Replicas.**  ``reward_model.model.path`` served by the rollout engines: ``hf`` -- one
  :class:`~hybridflow.workers.rollout_server_worker.RolloutServerWorker` per process, either colocated with the
  actor (a role of the colocated host, ``reward_model.enable_resource_pool=false``: woken for the reward stage and
  put back to sleep after it, as verl's colocate mode) or on a pool of its own (``enable_resource_pool=true``,
  ``reward_model.nnodes x n_gpus_per_node`` processes, one in this process with ``trainer.backend=local``; always
  awake); ``vllm`` -- vLLM server processes (``VLLMServerFleet`` with the judge's own weights, nothing synced).
  The engine settings come from ``reward_model.rollout.*`` (every key of the actor rollout's that the node
  shares: ``dtype``, ``max_num_seqs``, ``tensor_model_parallel_size``, ``engine_kwargs``, ``seed``, ...).
* **Router.**  :class:`~hybridflow.rollout.service.judge_router.JudgeRouter` over those replicas, in this process,
  with the limits of ``reward_model.judge``.
* **Reward functions.**  The reward managers are built with ``judge``, ``reward_router_address`` and
  ``reward_model_tokenizer`` offered to the user's ``compute_score`` (``rewards/judge.py``);
  :class:`JudgedRewardFn` wraps a manager to wake / sleep a colocated judge around scoring and to add the router's
  ``judge/*`` counters to the step's reward metrics.
"""

from __future__ import annotations

from typing import Any

from hybridflow.rollout.service.fleet import RolloutFleet
from hybridflow.rollout.service.judge_router import JudgeRouter

__all__ = ["judge_enabled", "JudgeFleet", "JudgeService", "JudgedRewardFn", "JUDGE_ROLE"]

JUDGE_ROLE = "judge"


def judge_enabled(config) -> bool:
    return config.uses_judge


class JudgeFleet(RolloutFleet):
    """The judge's ``hf`` replicas (a ``RolloutServerWorker`` group or colocated view); its weights never change."""

    def __init__(self, group: Any):
        self.group = group
        self.replicas = list(group.rollout_replica(getattr(group, "host_role", None)))

    def wake_up(self, global_step: int | None = None) -> None:
        self.group.wake_up_rollout(None)

    def sleep(self) -> None:
        self.group.sleep_rollout()

    def update_weights(self) -> float | None:
        return None


class JudgeService:
    """The judge's fleet and router; ``colocated``: the fleet sleeps outside the reward stage."""

    def __init__(self, fleet: RolloutFleet, router: JudgeRouter, tokenizer_path: str, colocated: bool,
                 trust_remote_code: bool = False):
        self.fleet = fleet
        self.router = router
        self.tokenizer_path = tokenizer_path
        self.colocated = colocated
        self.trust_remote_code = trust_remote_code

    def reward_kwargs(self) -> dict[str, Any]:
        """The keywords offered to reward functions (``rewards/judge.py``)."""
        from hybridflow.rewards.judge import JudgeClient, LazyTokenizer

        return {"reward_router_address": self.router.address,
                "reward_model_tokenizer": LazyTokenizer(self.tokenizer_path, self.trust_remote_code),
                "judge": JudgeClient(self.router.address, self.router.limits.request_timeout_s)}

    def close(self) -> None:
        self.router.close()
        self.fleet.shutdown()


class JudgedRewardFn:
    """A reward manager whose scorers ask the judge: wakes a colocated judge for the call, adds ``judge/*``."""

    def __init__(self, manager: Any, service: JudgeService):
        self.manager = manager
        self.service = service

    def __call__(self, data, return_dict: bool = False):
        service = self.service
        if service.colocated:
            service.fleet.wake_up()
        try:
            out = self.manager(data, return_dict=True)
        finally:
            if service.colocated:
                service.fleet.sleep()
        out.setdefault("reward_metrics", {}).update(service.router.take_metrics())
        return out if return_dict else out["reward_tensor"]

    def close(self) -> None:
        self.manager.close()

    def __getattr__(self, name: str):
        return getattr(self.manager, name)
