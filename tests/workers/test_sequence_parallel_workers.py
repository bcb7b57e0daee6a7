"""The workers with Ulysses sequence parallelism (2 gloo ranks, sp = 2) against one process without it: actor/ref,
critic and reward model.

``sp_worker_scenario.py`` runs the actor/ref worker (reference log-probs, log-probs and a PPO update with
token-budget micro-batches) and the critic worker (values and an update) with ``ulysses_sequence_parallel_size=2``;
the parent repeats the same calls with sp = 1 in this process.  The micro-batches differ (the token budget of an
sp group is budget x sp), the losses are normalised by global counts, so the updates must agree.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

A = "actor_rollout_ref"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reward_model(lm_dir: str, out) -> str:
    """A sequence-classification checkpoint of the tiny LM with a saved (seeded) score head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(lm_dir, num_labels=1).save_pretrained(out)
    AutoTokenizer.from_pretrained(lm_dir).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def sp_run(config_factory, tmp_path_factory):
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    model = str(make_tiny_checkpoint(tmp_path_factory.mktemp("varied_lm"), size="nano", initializer_range=0.2))
    rm_dir = _reward_model(model, tmp_path_factory.mktemp("varied_rm"))
    cfg = config_factory(
        model, "trainer.n_gpus_per_node=2", "algorithm.adv_estimator=gae",
        f"{A}.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2",
        f"{A}.actor.use_dynamic_bsz=true", f"{A}.actor.ppo_max_token_len_per_gpu=12",
        f"{A}.rollout.log_prob_use_dynamic_bsz=true", f"{A}.rollout.log_prob_max_token_len_per_gpu=16",
        f"{A}.ref.log_prob_use_dynamic_bsz=true", f"{A}.ref.log_prob_max_token_len_per_gpu=16",
        f"{A}.actor.use_kl_loss=true", "critic.model.use_remove_padding=true", "critic.use_dynamic_bsz=true",
        "critic.ppo_max_token_len_per_gpu=12", "critic.forward_max_token_len_per_gpu=16", "critic.optim.lr=1e-3",
        "critic.ppo_mini_batch_size=2", "reward_model.enable=true", f"reward_model.model.path={rm_dir}",
        "reward_model.model.use_remove_padding=true", "reward_model.ulysses_sequence_parallel_size=2",
        "reward_model.micro_batch_size_per_gpu=4",
    )
    for optim in (cfg.actor_rollout_ref.actor.optim, cfg.critic.optim):
        optim.override_optimizer_config = {"eps": 1.0}  # Adam step ~ linear in the gradient
    out_dir = tmp_path_factory.mktemp("sp_workers")
    cfg_path = out_dir / "cfg.pkl"
    cfg_path.write_bytes(pickle.dumps(cfg))
    script = Path(__file__).with_name("sp_worker_scenario.py")
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", port, str(cfg_path), str(out_dir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-4000:]}"
    single = copy.deepcopy(cfg)
    single.actor_rollout_ref.actor.ulysses_sequence_parallel_size = 1
    single.actor_rollout_ref.ref.ulysses_sequence_parallel_size = 1
    single.critic.ulysses_sequence_parallel_size = 1
    single.reward_model.ulysses_sequence_parallel_size = 1
    return single, str(out_dir), torch.load(os.path.join(out_dir, "after_update.pt"))


def _assert_states_close(got: dict, want: dict, init: dict) -> None:
    assert set(got) == set(want)
    worst = max(float((got[k] - want[k]).abs().max()) for k in got)
    assert worst <= 1e-5, f"parameters differ by {worst:.3g}"
    assert sum(not torch.equal(init[k], got[k]) for k in init if k in got) > 10  # the update moved the weights


def test_actor_and_ref_with_sp_equal_one_process(sp_run, batches):
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg, _, saved = sp_run
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    data = batches.make_update_batch(worker.actor_engine.module.config.vocab_size, seed=0)
    ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
    mask = data.batch["response_mask"]  # outside it the layouts read different (unused) labels
    assert torch.allclose(ref * mask, saved["ref_log_prob"] * mask, atol=1e-5)
    data.batch["ref_log_prob"] = saved["ref_log_prob"]  # the same KL target in both runs
    metrics = batches.run_update(worker, data)
    init = load_causal_lm(cfg.actor_rollout_ref.model.path).state_dict()
    _assert_states_close(worker.actor_engine.full_state_dict(), saved["state"], init)
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss"):
        assert metrics[key] == pytest.approx(saved["metrics"][key], rel=1e-4, abs=1e-6), key


def test_critic_with_sp_equals_one_process(sp_run, batches):
    from hybridflow.protocol import DataProto
    from hybridflow.workers.critic import CriticWorker

    cfg, _, saved = sp_run
    critic = CriticWorker(cfg.critic)
    critic.init_model()
    init = {k: v.clone() for k, v in critic.engine.full_state_dict().items()}
    data = batches.make_update_batch(critic.engine.module.config.vocab_size, seed=0)
    values = critic.compute_values(data).batch["values"]
    assert torch.allclose(values, saved["values"], atol=1e-5)
    g = torch.Generator().manual_seed(7)
    returns = torch.randn(data.batch["responses"].shape, generator=g)
    cdata = DataProto.from_dict({**dict(data.batch), "values": values, "returns": returns})
    metrics = critic.update_critic(cdata).meta_info["metrics"]
    _assert_states_close(critic.engine.full_state_dict(), saved["critic_state"], init)
    assert metrics["critic/grad_norm"] == pytest.approx(saved["critic_metrics"]["critic/grad_norm"], rel=1e-4)


def test_reward_model_with_sp_equals_one_process(sp_run, batches):
    from hybridflow.workers.reward_model import RewardModelWorker

    cfg, _, saved = sp_run
    rm = RewardModelWorker(cfg.reward_model)
    rm.init_model()
    data = batches.make_update_batch(rm.engine.module.config.vocab_size, seed=0)
    scores = rm.compute_rm_score(data).batch["rm_scores"]
    assert scores.abs().sum() > 0 and torch.allclose(scores, saved["rm_scores"], atol=1e-5)


def test_sp_checkpoint_has_one_shard_per_rank(sp_run):
    _, out_dir, _ = sp_run
    names = sorted(os.listdir(os.path.join(out_dir, "global_step_1", "actor")))
    for r in range(2):
        assert f"model_world_size_2_rank_{r}.pt" in names
