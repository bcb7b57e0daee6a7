"""Small verl command lines and a run helper shared by the end-to-end tests (importable as ``run_helpers``)."""

from __future__ import annotations


def small_overrides(model_dir, data_dir, out_dir, backend="local", steps=2, n=4, batch=8, extra=()):
    """A few-second run: ``batch`` prompts x ``n`` samples, 4-token answers, fp32 on CPU."""
    a = "actor_rollout_ref"
    return [
        f"{a}.model.path={model_dir}", f"critic.model.path={model_dir}", f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'test.parquet'}", f"data.train_batch_size={batch}",
        "data.max_prompt_length=32", "data.max_response_length=4", "data.seed=1",
        f"{a}.rollout.name=hf", f"{a}.rollout.n={n}", f"{a}.actor.ppo_mini_batch_size={batch // 2}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu=8", f"{a}.rollout.log_prob_micro_batch_size_per_gpu=16",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu=16", f"{a}.actor.optim.lr=1e-3",
        f"{a}.model.enable_gradient_checkpointing=false",
        "critic.ppo_micro_batch_size_per_gpu=8", "critic.forward_micro_batch_size_per_gpu=16", "critic.optim.lr=1e-3",
        f"trainer.backend={backend}", "trainer.device=cpu", "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={1 if backend == 'local' else 2}", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.logger=[file]", "trainer.report=false", f"trainer.default_local_dir={out_dir / 'ckpt'}",
        "trainer.project_name=it", "trainer.experiment_name=run", "trainer.seed=1",
        *extra,
    ]


def run(overrides, out_dir, should_stop=None):
    """Load the config and train; the logger writes into ``out_dir``. Returns the metric history."""
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cfg = load_config(list(overrides))
    logger = Tracking("it", "run", default_backend=["file"], output_dir=out_dir)
    return train_ppo(cfg, logger=logger, should_stop=should_stop)


def assert_timings_are_durations(records):
    """Every ``timing_s/*`` metric of a run's records is a duration: a stage ``hybridflow/tracking/units.py`` lists
    as timed, finite and >= 0, and not a whole number unless 0 (a clock's reading never is; a token count always
    is). Returns the names checked."""
    import math

    from hybridflow.tracking.units import DURATION_STAGES, is_duration

    names = sorted({k for rec in records for k in rec if k.startswith("timing_s/")})
    assert names, "the run logged no timing_s/* metric"
    unknown = [k for k in names if not is_duration(k)]
    assert not unknown, (f"timing_s/ holds names that are not timed stages: {unknown}; log counts and lengths under "
                         f"another family, or add a new stage to DURATION_STAGES ({sorted(DURATION_STAGES)})")
    for rec in records:
        for k, v in rec.items():
            if k.startswith("timing_s/"):
                assert math.isfinite(v) and v >= 0, f"{k}={v} at step {rec.get('step')}"
                assert v == 0 or v != int(v), f"{k}={v} at step {rec.get('step')} is a whole number: a count?"
    return names
