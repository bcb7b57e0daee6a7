"""The actor, critic and PRIME PRM act on ``enable_gradient_checkpointing``'s decision (``engine/activation_memory.py``):
null decides by memory, true / false as set, and rank 0 prints the decision."""

from __future__ import annotations

import pytest

from hybridflow.engine import activation_memory as am


def _layers_checkpointed(module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in module.modules())


@pytest.mark.parametrize("setting, free_mib, expect", [
    ("null", None, False),  # a tiny model's activations fit in any host
    ("null", 1, True),  # one MiB free: they do not
    ("true", None, True),
    ("false", 1, False),
])
def test_actor_and_critic_act_on_the_decision(tiny_model_dir, config_factory, monkeypatch, capsys, setting,
                                               free_mib, expect):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker
    from hybridflow.workers.critic import CriticWorker

    if free_mib is not None:
        monkeypatch.setattr(am, "free_bytes_per_process", lambda device: free_mib << 20)
    cfg = config_factory(tiny_model_dir, f"actor_rollout_ref.model.enable_gradient_checkpointing={setting}",
                         f"critic.model.enable_gradient_checkpointing={setting}",
                         "critic.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=gae")
    actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor")
    actor.init_model(total_training_steps=2)
    assert actor.activation_checkpointing.enabled is expect
    assert _layers_checkpointed(actor.actor_engine.module) is expect
    critic = CriticWorker(cfg.critic)
    critic.init_model(total_training_steps=2, max_seq_len=11)
    assert critic.activation_checkpointing.enabled is expect
    assert _layers_checkpointed(critic.engine.module) is expect
    out = capsys.readouterr().out
    word = "on" if expect else "off"
    assert f"activation checkpointing (actor): {word} -- actor_rollout_ref.model.enable_gradient_checkpointing=" in out
    assert f"activation checkpointing (critic): {word} -- critic.model.enable_gradient_checkpointing=" in out


@pytest.mark.parametrize("free_mib, expect", [(None, False), (1, True)])
def test_prime_prm_acts_on_the_decision(tiny_model_dir, config_factory, monkeypatch, capsys, free_mib, expect):
    """PRIME's implicit PRM trains too: its key follows the actor's (null) and decides by memory."""
    from hybridflow.workers.prime_rm import PrimeRewardModelWorker

    if free_mib is not None:
        monkeypatch.setattr(am, "free_bytes_per_process", lambda device: free_mib << 20)
    cfg = config_factory(tiny_model_dir, "trainer.recipe=prime", "reward_model.enable=true",
                         f"reward_model.model.path={tiny_model_dir}", "reward_model.reward_manager=prime",
                         "algorithm.adv_estimator=rloo")
    assert cfg.reward_model.model.enable_gradient_checkpointing is None
    prm = PrimeRewardModelWorker(cfg.reward_model, tiny_model_dir)
    prm.init_model(total_training_steps=2)
    assert prm.activation_checkpointing.enabled is expect
    assert _layers_checkpointed(prm.engine.module) is expect
    assert f"activation checkpointing (implicit PRM): {'on' if expect else 'off'}" in capsys.readouterr().out
