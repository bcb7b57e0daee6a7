"""DAPO (Yu et al. 2025): ``python -m hybridflow.recipe.dapo.main_dapo``, verl-recipe's ``recipe.dapo.main_dapo``."""
