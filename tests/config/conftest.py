"""Files a ``hybridflow train --dry-run`` reads: the run stage of the check pipeline opens the model's config.json and
counts the data files' rows, so a dry run that should pass points at real (tiny) ones."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def dry_run_data(tmp_path_factory):
    """16 train / 8 test prompts of the built-in addition task."""
    from hybridflow.data.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("dry_run_data")
    write_synthetic("addition", str(d), train_size=16, test_size=8, seed=0)
    return d


@pytest.fixture()
def dry_run_assets(nano_model_dir, dry_run_data, tmp_path):
    """Overrides (appended last, so they win) that make a verl command line's files exist here."""
    a = "actor_rollout_ref"
    return [f"{a}.model.path={nano_model_dir}", f"critic.model.path={nano_model_dir}",
            f"reward_model.model.path={nano_model_dir}", f"data.train_files={dry_run_data / 'train.parquet'}",
            f"data.val_files={dry_run_data / 'test.parquet'}", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.logger=[console]", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
            f"{a}.rollout.name=hf"]
