"""verl-recipe's entry points under hybridflow's name: ``python -m hybridflow.recipe.spin.main_spin``,
``hybridflow.recipe.sppo.main_sppo`` and ``hybridflow.recipe.prime.main_prime`` take the recipes' command lines
(``recipe.X.main_X`` -> ``hybridflow.recipe.X.main_X``) and run them on the one PPO step with the recipe's stage
options (``trainer.recipe``; see ``docs/algorithms.md``)."""

from __future__ import annotations

import sys

__all__ = ["run_recipe"]


def run_recipe(config_name: str, argv: list[str] | None = None) -> int:
    """The trainer's entry point with the recipe's config (``hybridflow/config/<config_name>.yaml``, verl-recipe's
    defaults over ``ppo_trainer``) unless the command line names a config itself."""
    from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name
    from hybridflow.trainer.main_ppo import main as train_main

    return train_main(with_config_name(list(sys.argv[1:] if argv is None else argv), config_name))
