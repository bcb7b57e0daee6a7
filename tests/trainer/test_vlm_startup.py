"""A vision-language checkpoint is refused at start-up until the rollout generates with pixel inputs."""

from types import SimpleNamespace

import pytest


def _config(model_dir):
    model = SimpleNamespace(path=model_dir, tokenizer_path=None, trust_remote_code=False, custom_chat_template=None)
    return SimpleNamespace(actor_rollout_ref=SimpleNamespace(model=model))


def test_vlm_run_is_refused_not_trained_text_only(tiny_vlm_dir, nano_model_dir):
    from hybridflow.trainer.main_ppo import load_processor_for

    assert load_processor_for(_config(nano_model_dir)) is None
    with pytest.raises(NotImplementedError, match="vision-language model.*rollout does not generate with images"):
        load_processor_for(_config(tiny_vlm_dir))
