"""``python -m hybridflow.recipe.prime.main_prime key=value ...``: verl-recipe's PRIME (``recipe.prime.main_prime``).

Process reinforcement through implicit rewards (Cui et al. 2025, arXiv:2502.01456): an implicit process reward
model (a causal LM, ``reward_model.model.path``, beside a frozen reference) is trained online on the verifier's
outcome labels in its own update step of the dataflow, and its token-level rewards are combined with the outcome
rewards through leave-one-out baselines (``algorithm.reward_dpo_coef`` / ``reward_gt_coef``).  Prompts are
over-sampled and filtered by accuracy (``data.oversample_factor``, ``data.filter_accuracy``).  Config:
``hybridflow/config/prime_trainer.yaml``; the stages: ``hybridflow/trainer/hooks/prime.py``.
"""

from __future__ import annotations

import sys

from hybridflow.recipe import run_recipe


def main(argv: list[str] | None = None) -> int:
    return run_recipe("prime_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
