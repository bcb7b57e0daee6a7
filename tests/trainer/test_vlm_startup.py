"""A vision-language checkpoint is refused at start-up until the rollout generates with pixel inputs."""

import warnings

import pytest


def _config(model_dir):
    from hybridflow.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=hf"])


def test_vlm_run_is_refused_not_trained_text_only(tiny_vlm_dir, nano_model_dir):
    from hybridflow.trainer.main_ppo import load_processor_for

    assert load_processor_for(_config(nano_model_dir)) is None
    with pytest.raises(NotImplementedError, match="vision-language model.*rollout does not generate with images"):
        load_processor_for(_config(tiny_vlm_dir))
