"""The recipes' keys (SPIN, SPPO, PRIME, distillation, the judge) act in the run that reads them or are refused
with the reason, and the recipes' entry points load verl-recipe's defaults."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from hybridflow.config import ConfigError, ConfigWarning
from hybridflow.launch.config import load_config
from hybridflow.config.checks.distillation import teacher_entries

A = "actor_rollout_ref"
BASE = ["data.train_batch_size=8", f"{A}.actor.ppo_mini_batch_size=8", f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=1",
        "critic.ppo_micro_batch_size_per_gpu=4", "algorithm.adv_estimator=grpo", f"{A}.rollout.n=2"]


def refused(*overrides, name=None) -> str:
    with pytest.raises(ConfigError) as e:
        load_config([*BASE, *overrides], config_name=name)
    return str(e.value)


def load(*overrides, name=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config([*BASE, *overrides], config_name=name)


@pytest.mark.parametrize("key,value,recipe", [
    (f"{A}.actor.dpo_beta", "0.5", "SPIN"), ("algorithm.dpo_loss_type", "ipo", "SPIN"),
    ("algorithm.sppo_eta", "2.0", "SPPO"), (f"{A}.actor.sppo_eta", "2.0", "SPPO"),
    ("algorithm.reward_gt_coef", "1.0", "PRIME"), ("reward_model.model.beta_train", "0.1", "PRIME"),
    ("data.filter_accuracy", "true", "PRIME"), ("reward_model.prime_norm", "none", "PRIME"),
])
def test_a_recipe_key_outside_its_recipe_is_refused(key, value, recipe):
    msg = refused(f"{key}={value}")
    assert key in msg and recipe in msg and f"hybridflow.recipe.{recipe.lower()}.main_{recipe.lower()}" in msg


def test_the_entry_points_load_verl_recipes_defaults():
    spin = load(name="spin_trainer")
    assert spin.trainer.recipe == "spin" and spin.trainer.ref_update_freq == 1 and spin.use_reference_policy
    assert spin.actor_rollout_ref.rollout.n == 2 and not spin.use_critic
    sppo = load_config([a for a in BASE if not a.startswith("algorithm.adv_estimator")], config_name="sppo_trainer")
    assert sppo.algorithm.adv_estimator == "sppo" and sppo.actor_rollout_ref.actor.policy_loss.loss_mode == "sppo"
    prime = load_config([a for a in BASE if not a.startswith("algorithm.adv_estimator")] +
                        ["reward_model.model.path=/m"], config_name="prime_trainer")
    assert prime.trainer.recipe == "prime" and prime.reward_model.enable and prime.data.oversample_factor == 4.0
    assert prime.data.gen_batch_size == 32  # 8 prompts x oversample_factor 4 drawn per step
    assert not prime.use_critic and prime.reward_model.model.optim.grad_clip == 10.0


def test_the_entry_point_runs_through_the_cli_dry_run(dry_run_assets):
    out = subprocess.run([sys.executable, "-m", "hybridflow.recipe.spin.main_spin", "--dry-run", *BASE,
                          *dry_run_assets], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "recipe: spin" in out.stdout and "dry run: configuration is valid" in out.stdout


def test_spin_rules():
    assert "rollout.n=2" in refused("trainer.recipe=spin", f"{A}.rollout.n=4")
    assert "whole (chosen, rejected) pairs" in refused("trainer.recipe=spin", f"{A}.actor.ppo_micro_batch_size_per_gpu=3")
    assert "dpo_pairs" in refused("trainer.recipe=spin", "algorithm.dpo_pairs=best")
    cfg = load("trainer.recipe=spin", "algorithm.dpo_pairs=reference", f"{A}.rollout.n=3")
    assert cfg.algorithm.dpo_pairs == "reference"


def test_sppo_needs_its_estimator_and_loss_and_a_known_scope():
    assert "adv_estimator=sppo" in refused("trainer.recipe=sppo")
    assert "sppo_softmean_scope" in refused("algorithm.adv_estimator=sppo", "algorithm.sppo_softmean_scope=prompt")
    cfg = load("algorithm.adv_estimator=sppo", "algorithm.sppo_eta=0.5", "algorithm.sppo_softmean_scope=group")
    assert cfg.algorithm.sppo_eta == 0.5  # the estimator reads it without the recipe


def test_prime_rules():
    assert "reward_model.enable=true" in refused("trainer.recipe=prime", "algorithm.adv_estimator=rloo")
    assert "loss_type" in refused("reward_model.model.path=/m", "reward_model.model.loss_type=dpo", name="prime_trainer")
    assert "'reverse'" in refused("reward_model.model.path=/m", "reward_model.model.update=reverse", name="prime_trainer")
    assert "gen_batch_size" in refused("reward_model.model.path=/m", "data.gen_batch_size=12", name="prime_trainer")
    assert "adv_estimator" in refused("reward_model.model.path=/m", "algorithm.adv_estimator=gae", name="prime_trainer")


def test_reference_model_and_refresh_act_or_are_refused():
    cfg = load(f"{A}.actor.use_kl_loss=true", f"+{A}.ref.model.path=/other/model", "trainer.ref_update_freq=2")
    assert cfg.actor_rollout_ref.ref.model == {"path": "/other/model"} and cfg.trainer.ref_update_freq == 2
    assert "uses no reference policy" in refused(f"+{A}.ref.model.path=/other/model")
    assert "refreshes the reference" in refused("trainer.ref_update_freq=1")
    assert "adapter disabled" in refused(f"{A}.actor.use_kl_loss=true", "trainer.ref_update_freq=1",
                                         f"{A}.model.lora_rank=8")


def test_distillation_teachers_from_verl_keys():
    single = load("distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/t")
    entries, errors = teacher_entries(single.distillation)
    assert not errors and [(t.key, t.model_path) for t in entries] == [("default", "/t")]
    multi = load("distillation.enabled=true", "+distillation.teacher_models.math.key=math",
                 "+distillation.teacher_models.math.model_path=/a", "+distillation.teacher_models.gsm.key=gsm",
                 "+distillation.teacher_models.gsm.model_path=/b", "distillation.teacher_key=data_source")
    entries, errors = teacher_entries(multi.distillation)
    assert not errors and sorted((t.key, t.model_path) for t in entries) == [("gsm", "/b"), ("math", "/a")]
    assert "model_path is not set" in refused("distillation.enabled=true")
    assert "two teachers serve key" in refused("distillation.enabled=true", "+distillation.teacher_models.a.key=x",
                                               "+distillation.teacher_models.a.model_path=/a",
                                               "+distillation.teacher_models.b.key=x",
                                               "+distillation.teacher_models.b.model_path=/b")
    assert "use_policy_gradient=false and topk >= 1" in refused(
        "distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/t",
        "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.use_policy_gradient=true")
    assert "does not depend on the teacher" in refused(
        "distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/t",
        "distillation.distillation_loss.loss_mode=k1")
    assert "processes" in refused("distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/t",
                                  "distillation.nnodes=1", "distillation.n_gpus_per_node=3",
                                  "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2")


def test_judge_keys():
    judge = [f"custom_reward_function.path={__file__}", "reward_model.enable=true", "reward_model.rollout.name=hf",
             "reward_model.model.path=/j"]
    cfg = load(*judge, "reward_model.judge.max_rpm=600", "reward_model.judge.max_concurrent=4")
    assert cfg.uses_judge and cfg.reward_model.judge.max_rpm == 600
    assert "reward_model.enable=true" in refused(f"custom_reward_function.path={__file__}", "reward_model.rollout.name=hf")
    assert "judge served on the rollout service" in refused("reward_model.judge.max_rpm=10")
    assert "request_timeout_s" in refused(*judge, "reward_model.timeout_s=10", "reward_model.judge.request_timeout_s=20")
    assert "SGLang" in refused(*judge, "reward_model.rollout.name=sglang")
    assert "enable_resource_pool=true" in refused("reward_model.enable=true", "reward_model.n_gpus_per_node=2",
                                                  "reward_model.nnodes=1")
    pooled = load(*judge, "reward_model.enable_resource_pool=true", "reward_model.n_gpus_per_node=1",
                  "reward_model.nnodes=1")
    assert pooled.reward_model.enable_resource_pool
    # a served RM without a reward function is discriminative: the RM worker scores it (verl's reward loop rule)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        disrm = load_config([*BASE, "reward_model.enable=true", "reward_model.rollout.name=vllm"])
    assert not disrm.uses_judge
    assert any("discriminative" in str(w.message) for w in caught)


def test_judge_engine_keys_follow_the_actor_rollouts_policy_and_verl09_spelling():
    judge = [f"custom_reward_function.path={__file__}", "reward_model.enable=true", "reward_model.model.path=/j"]
    cfg = load(*judge, "reward.reward_model.rollout.name=hf", "reward.reward_model.rollout.max_num_seqs=7",
               "reward.reward_model.rollout.do_sample=false")
    assert cfg.uses_judge and cfg.reward_model.rollout.max_num_seqs == 7 and not cfg.reward_model.rollout.do_sample
    from hybridflow.launch.judge import judge_worker_config

    engine = judge_worker_config(cfg).rollout  # the judge's engine takes the node's keys, the checkpoint its path
    assert engine.max_num_seqs == 7 and engine.max_model_len == 2048 + 2048
    assert "answers each request once" in refused(*judge, "reward_model.rollout.name=hf", "reward_model.rollout.n=2")
    msg = refused(*judge, "reward_model.rollout.name=hf", "reward_model.rollout.scheduling_policy=priority")
    assert "reward_model.rollout.scheduling_policy is not supported for the judge" in msg
    assert "max_model_len" in refused(*judge, "reward_model.rollout.name=hf", "reward_model.rollout.max_model_len=16")
    assert "configures a judge" in refused("reward_model.rollout.max_num_seqs=7")  # no judge started: refused
