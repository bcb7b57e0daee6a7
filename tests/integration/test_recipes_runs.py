"""Two steps of every recipe through the real framework, on the in-process backend and on Ray with two CPU
workers: SPIN (both pairings), SPPO, PRIME, on-policy distillation (teachers colocated and on a pool of their own,
one or two teachers routed by data source) and a judge on the rollout service (colocated and on its own pool)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run, small_overrides

pytestmark = pytest.mark.slow

A = "actor_rollout_ref"
HERE = Path(__file__).parent
COMMON = [f"custom_reward_function.path={HERE / 'reward_fns.py'}", "reward_model.num_workers=0"]
JUDGE = [f"custom_reward_function.path={HERE / 'judge_fns.py'}", "custom_reward_function.name=ask_judge",
         "reward_model.enable=true", "reward_model.rollout.name=hf", "reward_model.rollout.response_length=4",
         "reward_model.rollout.prompt_length=128", "reward_model.timeout_s=60", "reward_model.judge.request_timeout_s=30",
         "reward_model.num_workers=1"]


def recipe_runs(model: str) -> dict[str, list[str]]:
    return {
        "spin_reward": ["trainer.recipe=spin", "trainer.ref_update_freq=1", f"{A}.rollout.n=2",
                        f"{A}.actor.ppo_micro_batch_size_per_gpu=4"],  # 2 pairs: divides a Ray worker's 4 rows
        "spin_reference": ["trainer.recipe=spin", "algorithm.dpo_pairs=reference", f"{A}.rollout.n=2",
                           "trainer.ref_update_freq=1", f"{A}.actor.use_dynamic_bsz=true"],
        "sppo": ["trainer.recipe=sppo", "algorithm.adv_estimator=sppo", f"{A}.actor.policy_loss.loss_mode=sppo",
                 "algorithm.sppo_softmean_scope=group"],
        "prime": ["trainer.recipe=prime", "reward_model.enable=true", f"reward_model.model.path={model}",
                  "reward_model.reward_manager=prime", "algorithm.adv_estimator=rloo",
                  "custom_reward_function.name=compute_digit_share", "reward_model.micro_batch_size_per_gpu=8",
                  "reward_model.mini_batch_size=4", "data.oversample_factor=2.0", "data.filter_accuracy=true",
                  "algorithm.use_kl_in_reward=true"],
        "distill_colocated": ["algorithm.adv_estimator=grpo", "distillation.enabled=true",
                              f"distillation.teacher_models.teacher_model.model_path={model}"],
        "distill_own_pool": ["algorithm.adv_estimator=grpo", "distillation.enabled=true", "distillation.nnodes=1",
                             "distillation.n_gpus_per_node=1",
                             "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=1",
                             f"distillation.teacher_models.teacher_model.model_path={model}",
                             "distillation.distillation_loss.loss_mode=k1",
                             "distillation.distillation_loss.use_policy_gradient=true"],
        # verl's forward_kl_topk (run_qwen3_8b_megatron.sh): the teacher's top-8 tokens, the student's forward KL
        "distill_topk": ["algorithm.adv_estimator=grpo", "distillation.enabled=true",
                         f"distillation.teacher_models.teacher_model.model_path={model}",
                         "distillation.distillation_loss.loss_mode=forward_kl_topk",
                         "distillation.distillation_loss.topk=8", "distillation.distillation_loss.use_task_rewards=false",
                         "distillation.distillation_loss.log_prob_min_clamp=-10.0"],
        "judge_colocated": ["algorithm.adv_estimator=grpo", f"reward_model.model.path={model}", *JUDGE],
        "judge_own_pool": ["algorithm.adv_estimator=grpo", f"reward_model.model.path={model}", *JUDGE,
                           "reward_model.enable_resource_pool=true", "reward_model.n_gpus_per_node=1",
                           "reward_model.nnodes=1"],
    }


def _check(name: str, metrics: list[dict]) -> None:
    steps = [m for m in metrics if "timing_s/step" in m]
    assert len(steps) == 2, name
    for m in steps:
        assert m["actor/grad_norm"] > 0, (name, m)
        if name.startswith("spin"):
            assert m["actor/dpo_pairs"] > 0 and "timing_s/update_ref" in m
        if name == "prime":
            assert m["reward_model/grad_norm"] > 0 and "prime/filter_pass_fraction" in m
        if name.startswith("distill"):
            assert m["distillation/rows/default"] == 32 and "timing_s/teacher" in m
        if name == "distill_topk":  # the student starts as its teacher: the same top-8 mass, a KL near 0
            assert 0 < m["distillation/teacher_mass"] <= 1 and abs(m["distillation/loss"]) < 0.05, m
            assert abs(m["distillation/teacher_mass"] - m["distillation/student_mass"]) < 0.05, m
        if name.startswith("judge"):
            assert m["judge/completed"] == 32 and m["reward/error_count"] == 0


NAMES = sorted(recipe_runs("m"))


@pytest.mark.parametrize("name", NAMES)
def test_recipe_runs_two_steps_locally(name, nano_model_dir, addition_data, tmp_path):
    extra = [*COMMON, *recipe_runs(nano_model_dir)[name]]
    history = run(small_overrides(nano_model_dir, addition_data, tmp_path, steps=2, extra=extra), tmp_path)
    _check(name, history.metrics)


RAY_CPUS = 4  # the shared ray_cluster fixture (conftest.py)


@pytest.mark.ray
@pytest.mark.parametrize("name", NAMES)
def test_recipe_runs_two_steps_on_ray(name, ray_cluster, nano_model_dir, addition_data, tmp_path):
    extra = [*COMMON, *recipe_runs(nano_model_dir)[name]]
    history = run(small_overrides(nano_model_dir, addition_data, tmp_path, backend="ray", steps=2, extra=extra),
                  tmp_path)
    _check(name, history.metrics)


def test_two_teachers_serve_their_data_sources(nano_model_dir, tmp_path):
    """Multi-teacher distillation: rows go to the teacher whose key is their data_source."""
    from hybridflow.data.io import write_parquet
    from hybridflow.data.synthetic import make_rows

    rows = make_rows("addition", 16, 0, "train") + make_rows("addition_fixed", 16, 0, "train")
    data = tmp_path / "data"
    write_parquet(rows, str(data / "train.parquet"))
    write_parquet(rows[:8], str(data / "test.parquet"))
    extra = [*COMMON, "algorithm.adv_estimator=grpo", "distillation.enabled=true", "data.shuffle=true",
             "+distillation.teacher_models.plain.key=synthetic/addition",
             f"+distillation.teacher_models.plain.model_path={nano_model_dir}",
             "+distillation.teacher_models.fixed.key=synthetic/addition_fixed",
             f"+distillation.teacher_models.fixed.model_path={nano_model_dir}"]
    history = run(small_overrides(nano_model_dir, data, tmp_path, steps=2, extra=extra), tmp_path)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    for m in steps:
        assert m.get("distillation/rows/synthetic/addition", 0) + m.get("distillation/rows/synthetic/addition_fixed", 0) == 32
    assert any("distillation/rows/synthetic/addition_fixed" in m for m in steps)


def test_log_freq_sends_every_kth_step_to_the_logger(nano_model_dir, addition_data, tmp_path):
    """trainer.log_freq (verl-recipe SPIN's +trainer.log_freq): all steps stay in the run's history, the logger gets
    every k-th step and the last."""
    import json

    extra = [*COMMON, "algorithm.adv_estimator=grpo", "trainer.log_freq=2"]
    history = run(small_overrides(nano_model_dir, addition_data, tmp_path, steps=3, extra=extra), tmp_path)
    assert [m["step"] for m in history.metrics if "timing_s/step" in m] == [1, 2, 3]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in logged if "timing_s/step" in e] == [2, 3]
