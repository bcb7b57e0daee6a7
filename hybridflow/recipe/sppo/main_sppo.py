"""``python -m hybridflow.recipe.sppo.main_sppo key=value ...``: verl-recipe's SPPO (``recipe.sppo.main_sppo``).

Self-play preference optimisation (Wu et al. 2024, arXiv:2405.00675) in verl-recipe's form: the advantage
estimator ``sppo`` centres each response's reward by the soft mean of the batch's rewards (``algorithm.sppo_eta``
is the soft mean's beta, ``algorithm.sppo_softmean_scope`` batch | group) and the policy loss ``sppo`` regresses the
sequence log-ratio against ``actor.sppo_eta`` times it (``hybridflow/algorithms/sppo.py``).  Nothing else changes
in the PPO step.  Config: ``hybridflow/config/sppo_trainer.yaml``.
"""

from __future__ import annotations

import sys

from hybridflow.recipe import run_recipe


def main(argv: list[str] | None = None) -> int:
    return run_recipe("sppo_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
