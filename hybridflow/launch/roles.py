"""The roles a run adds beside the actor (and critic): the reward model (a sequence-classification RM, or PRIME's
implicit PRM) colocated or on a pool of its own, the distillation teachers, and a judge on the rollout service.

``processes.create_workers`` asks :func:`extra_colocated_roles` for the classes that live in the actor's processes
and :func:`start_pooled_roles` for those on pools of their own; the launch starts the judge's router with
``judge.start_judge_service`` once the models are loaded.
"""

from __future__ import annotations

import copy
from typing import Any

from hybridflow.config.checks.distillation import TeacherEntry, teacher_entries
from hybridflow.launch.judge import judge_worker_config
from hybridflow.launch.pools import own_pool_group
from hybridflow.trainer.judge_service import JUDGE_ROLE, judge_enabled
from hybridflow.trainer.teachers import Teacher, TeacherRouter

__all__ = ["colocated_teacher_roles", "extra_colocated_roles", "reward_model_class", "reward_model_pool",
           "start_pooled_roles", "start_teacher_pools", "teacher_worker_config"]


def reward_model_class(config):
    """The reward-model role: a sequence-classification RM, or PRIME's implicit PRM (``trainer.recipe=prime``)."""
    from hybridflow.controller import ClassWithInitArgs

    if config.trainer.recipe == "prime":
        from hybridflow.workers.prime_rm import PrimeRewardModelWorker

        return ClassWithInitArgs(PrimeRewardModelWorker, config.reward_model, config.actor_rollout_ref.model.path)
    from hybridflow.workers.reward_model import RewardModelWorker

    return ClassWithInitArgs(RewardModelWorker, config.reward_model)


def extra_colocated_roles(config) -> tuple[dict[str, Any], dict]:
    """``(role -> ClassWithInitArgs, colocated teachers)`` of the roles that live in the actor's processes: the reward
    model (unless on its own pool or served as a judge), an ``hf`` judge colocated with the actor, and the
    distillation teachers with ``distillation.nnodes=0``."""
    from hybridflow.controller import ClassWithInitArgs
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    rm = config.reward_model
    roles: dict[str, Any] = {}
    if judge_enabled(config):  # a generative RM on the rollout service; colocated: a role of this host
        if rm.rollout.name == "hf" and not rm.enable_resource_pool:
            from hybridflow.workers.rollout_server_worker import RolloutServerWorker

            roles[JUDGE_ROLE] = ClassWithInitArgs(RolloutServerWorker, judge_worker_config(config))
    elif rm.enable and not rm.enable_resource_pool:
        roles["reward_model"] = reward_model_class(config)
    teachers = colocated_teacher_roles(config)  # distillation teachers in the actor's processes
    for role, (teacher_cfg, _) in teachers.items():
        roles[role] = ClassWithInitArgs(ActorRolloutRefWorker, teacher_cfg, "ref")
    return roles, teachers


def reward_model_pool(config, use_gpu: bool, closers: list, options: dict):
    """``reward_model.enable_resource_pool``: the reward model's worker group on ``reward_model.nnodes x
    n_gpus_per_node`` processes of its own (one in this process with the local backend)."""
    rm = config.reward_model
    return own_pool_group(config.trainer.backend, [int(rm.n_gpus_per_node)] * int(rm.nnodes), reward_model_class(config),
                          "reward_model", use_gpu, closers, options)


def start_pooled_roles(config, views: dict, colocated_teachers: dict, use_gpu: bool, closers: list,
                       options: dict):
    """Start the roles on pools of their own (the reward model, teachers with ``distillation.nnodes > 0``); adds the
    reward model's group to ``views`` and returns the teachers' router (``None`` without distillation)."""
    rm = config.reward_model
    if rm.enable and rm.enable_resource_pool and not judge_enabled(config):
        views["reward_model"] = reward_model_pool(config, use_gpu, closers, options)
    if not config.distillation.enabled:
        return None
    teachers = [Teacher(entry, views[role]) for role, (_, entry) in colocated_teachers.items()]
    teachers += start_teacher_pools(config, use_gpu, closers, options)
    return TeacherRouter(teachers, config.distillation.teacher_key)


def teacher_worker_config(actor_rollout_ref: Any, entry: TeacherEntry) -> Any:
    """The ``ActorRolloutRefConfig`` a teacher worker runs with: the student's (its tokenizer, micro-batching,
    precision) with the reference model replaced by the teacher's checkpoint."""
    cfg = copy.deepcopy(actor_rollout_ref)
    cfg.ref.model = {"path": entry.model_path}
    cfg.ref.fsdp_config.dtype = entry.dtype
    return cfg


def _role(entry: TeacherEntry) -> str:
    return f"teacher_{entry.name}"


def colocated_teacher_roles(config) -> dict[str, tuple[Any, TeacherEntry]]:
    """``{role: (worker config, entry)}`` of the teachers placed in the actor's processes (``nnodes=0``)."""
    dist = config.distillation
    if not dist.enabled or int(dist.nnodes) > 0:
        return {}
    entries, _ = teacher_entries(dist)
    return {_role(e): (teacher_worker_config(config.actor_rollout_ref, e), e) for e in entries}


def start_teacher_pools(config, use_gpu: bool, closers: list, pool_options: dict) -> list[Teacher]:
    """One pool and worker group per teacher (``distillation.nnodes > 0``); models not loaded yet."""
    from hybridflow.controller import ClassWithInitArgs
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    dist = config.distillation
    if not dist.enabled or int(dist.nnodes) == 0:
        return []
    backend = config.trainer.backend
    entries, _ = teacher_entries(dist)
    teachers = []
    for entry in entries:
        cls = ClassWithInitArgs(ActorRolloutRefWorker, teacher_worker_config(config.actor_rollout_ref, entry), "ref")
        group = own_pool_group(backend, [int(entry.world_size)], cls, _role(entry), use_gpu, closers, pool_options)
        teachers.append(Teacher(entry, group))
    return teachers
