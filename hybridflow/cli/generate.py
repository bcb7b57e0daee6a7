"""``hybridflow generate`` / ``hybridflow eval``: generate for a dataset with a model and score it.

Same config keys as training (``actor_rollout_ref.model.path``, ``data.val_files``, ``rollout.val_kwargs``,
``reward_model.*``, ``custom_reward_function.*``, ``trainer.backend``...), same worker groups, rollout engine,
reward manager and validation metrics as the trainer's validation step -- so an evaluation here is
comparable with the ``val-core/...`` numbers of a training run.  Generations are written as JSONL to
``trainer.validation_data_dir`` (default ``outputs/<project>/<experiment>/generations``), metrics printed and
returned.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridflow.trainer.validation import ValidationResult, Validator


def run_generation(config) -> ValidationResult:
    """Generate ``val_kwargs.n`` responses per prompt of ``data.val_files``, score them, aggregate."""
    from hybridflow.data.loaders import create_val_dataloader
    from hybridflow.data.rl_dataset import create_rl_dataset
    from hybridflow.launch.inputs import build_reward_fns, load_processor_for, load_tokenizer_for
    from hybridflow.launch.run import build_runtime

    if not config.data.val_files:
        raise ValueError("hybridflow generate needs data.val_files=<parquet/json with prompts> to generate for")
    tcfg = config.trainer
    dump_dir = tcfg.validation_data_dir or str(Path("outputs") / tcfg.project_name / tcfg.experiment_name / "generations")
    tokenizer = load_tokenizer_for(config)
    dataset = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor=load_processor_for(config),
                                is_train=False)
    loader = create_val_dataloader(dataset, config.data)
    _, reward_fn = build_reward_fns(config, tokenizer)
    # Generation never trains: no critic, reference or optimizer schedule is needed.
    config.critic.enable = False
    config.actor_rollout_ref.actor.use_kl_loss = False
    config.algorithm.use_kl_in_reward = False
    config.actor_rollout_ref.actor.optim.total_training_steps = 1
    runtime = build_runtime(config, tokenizer)
    try:
        validator = Validator(runtime.groups, loader, reward_fn, tokenizer, config.actor_rollout_ref.rollout.val_kwargs,
                              num_log_samples=tcfg.log_val_generations, seed=tcfg.seed, dump_dir=dump_dir)
        result = validator.run(global_step=0)
    finally:
        reward_fn.close()
        runtime.close()
    print(f"generations written to {Path(dump_dir) / '0.jsonl'}")
    return result


def main(argv: list[str] | None = None, cmd: str = "generate") -> int:
    from hybridflow.cli.help import generate_help, wants_help
    from hybridflow.launch.command_line import load_trainer_config
    from hybridflow.utils.quiet import quiet_libraries

    quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        return generate_help(argv, cmd)
    config, _ = load_trainer_config(argv)
    result = run_generation(config)
    for key in sorted(result.metrics):
        print(f"{key}: {result.metrics[key]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
