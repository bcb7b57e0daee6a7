"""``python -m hybridflow.recipe.spin.main_spin key=value ...``: verl-recipe's SPIN (``recipe.spin.main_spin``).

Self-play fine-tuning (Chen et al. 2024, arXiv:2401.01335) as online DPO: per prompt a (chosen, rejected) pair --
the better of two samples by reward (verl-recipe, ``algorithm.dpo_pairs=reward``) or the dataset's answer over the
model's own sample (the paper, ``dpo_pairs=reference``) -- trained with the DPO loss (``actor.dpo_beta``,
``algorithm.dpo_loss_type``) against a reference refreshed from the actor every ``trainer.ref_update_freq`` steps.
Config: ``hybridflow/config/spin_trainer.yaml``; the step: ``hybridflow/trainer/hooks/spin.py``.
"""

from __future__ import annotations

import sys

from hybridflow.recipe import run_recipe


def main(argv: list[str] | None = None) -> int:
    return run_recipe("spin_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
