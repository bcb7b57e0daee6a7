"""Fixtures for worker tests: typed configs for the tiny checkpoints and rollout-shaped batches."""

import importlib.util
from pathlib import Path

import pytest

BASE_OVERRIDES = [
    "actor_rollout_ref.rollout.name=hf",
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=4",
    "data.max_prompt_length=6",
    "data.max_response_length=5",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "trainer.n_gpus_per_node=1",
    "trainer.device=cpu",
]


def load_batches_module():
    spec = importlib.util.spec_from_file_location(
        "hf_test_batches", Path(__file__).parents[1] / "engine" / "batches.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def batches():
    return load_batches_module()


def make_config(model_dir: str, *overrides: str):
    """The full typed ``PPOConfig`` for ``model_dir`` with test-sized batches plus ``overrides``."""
    import warnings

    from hybridflow.launch.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(
            [f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}", *BASE_OVERRIDES, *overrides]
        )


@pytest.fixture(scope="session")
def config_factory():
    return make_config


@pytest.fixture
def tiny_causal_lm_factory(tiny_model_dir):
    """Fresh copies of the tiny causal LM (train mode, for gradient comparisons)."""
    from hybridflow.engine.model_loader import load_causal_lm

    return lambda: load_causal_lm(tiny_model_dir)
