"""The roles a run adds beside the actor (and critic): the reward model (a sequence-classification RM, or PRIME's
implicit PRM) colocated or on a pool of its own, the distillation teachers, and a judge on the rollout service.

``runtime.create_workers`` asks :func:`extra_colocated_roles` for the classes that live in the actor's processes
and :func:`start_pooled_roles` for those on pools of their own; ``train_ppo`` starts the judge's router with
``runtime.start_judge_service`` once the models are loaded.
"""

from __future__ import annotations

from typing import Any

__all__ = ["extra_colocated_roles", "reward_model_class", "reward_model_pool", "start_pooled_roles"]


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
    from hybridflow.trainer.judge_service import JUDGE_ROLE, judge_enabled, judge_worker_config
    from hybridflow.trainer.teachers import colocated_teacher_roles
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
    from hybridflow.trainer.role_pools import own_pool_group

    rm = config.reward_model
    return own_pool_group(config.trainer.backend, [int(rm.n_gpus_per_node)] * int(rm.nnodes), reward_model_class(config),
                          "reward_model", use_gpu, closers, options)


def start_pooled_roles(config, views: dict, colocated_teachers: dict, use_gpu: bool, closers: list,
                       options: dict):
    """Start the roles on pools of their own (the reward model, teachers with ``distillation.nnodes > 0``); adds the
    reward model's group to ``views`` and returns the teachers' router (``None`` without distillation)."""
    from hybridflow.trainer.judge_service import judge_enabled

    rm = config.reward_model
    if rm.enable and rm.enable_resource_pool and not judge_enabled(config):
        views["reward_model"] = reward_model_pool(config, use_gpu, closers, options)
    if not config.distillation.enabled:
        return None
    from hybridflow.trainer.teachers import Teacher, TeacherRouter, start_teacher_pools

    teachers = [Teacher(entry, views[role]) for role, (_, entry) in colocated_teachers.items()]
    teachers += start_teacher_pools(config, use_gpu, closers, options)
    return TeacherRouter(teachers, config.distillation.teacher_key)
