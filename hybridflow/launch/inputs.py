"""What the driver builds for a run besides the processes: tokenizer and processor, datasets and loaders, the
reward managers and the metrics logger (all from the config, all on the driver)."""

from __future__ import annotations

__all__ = ["build_data", "build_logger", "build_reward_fns", "check_dataset_agent_names", "load_processor_for",
           "load_tokenizer_for"]


def build_data(config, tokenizer, processor=None):
    """Train / validation datasets and loaders (``data.*``); validation is skipped without ``val_files``.

    ``processor``: the multimodal processor of a vision-language model (:func:`load_processor_for`).
    """
    from hybridflow.data.loaders import create_train_dataloader, create_val_dataloader
    from hybridflow.data.rl_dataset import create_rl_dataset

    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor=processor, is_train=True)
    train_loader = create_train_dataloader(train, config.data)
    val_loader = None
    if config.data.val_files:
        val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor=processor, is_train=False)
        val_loader = create_val_dataloader(val, config.data)
    return train_loader, val_loader


def check_dataset_agent_names(*loaders) -> None:
    """Rows naming an agent loop nobody registered stop the run here, before any model loads."""
    from hybridflow.agents.setup_check import check_agent_names

    for loader in loaders:
        if loader is not None:
            check_agent_names(loader.dataset)


def build_reward_fns(config, tokenizer, judge=None):
    """Training manager (``num_examine=0``) and validation manager (``num_examine=1``), as verl; with a judge
    (``trainer/judge_service.py``) their functions are offered its client and wrapped to count its requests."""
    from hybridflow.rewards import load_reward_manager

    if judge is None:
        return load_reward_manager(config, tokenizer, num_examine=0), load_reward_manager(config, tokenizer, num_examine=1)
    from hybridflow.trainer.judge_service import JudgedRewardFn

    offered = judge.reward_kwargs()
    return tuple(JudgedRewardFn(load_reward_manager(config, tokenizer, num_examine=k, judge_kwargs=offered), judge)
                 for k in (0, 1))


def build_logger(config, total_steps: int):
    from hybridflow.config import config_to_dict
    from hybridflow.tracking import Tracking

    tcfg = config.trainer
    return Tracking(project_name=tcfg.project_name, experiment_name=tcfg.experiment_name,
                    default_backend=tcfg.logger, config=config_to_dict(config), total_steps=total_steps)


def load_tokenizer_for(config):
    from hybridflow.engine.model_loader import load_tokenizer

    model = config.actor_rollout_ref.model
    return load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                          field="actor_rollout_ref.model.path")


def load_processor_for(config):
    """The multimodal processor of ``actor_rollout_ref.model`` (``None`` for a text-only model)."""
    from hybridflow.engine.model_loader import load_processor

    model = config.actor_rollout_ref.model
    processor = load_processor(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                               field="actor_rollout_ref.model.path")
    return processor
