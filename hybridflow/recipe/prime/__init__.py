"""verl-recipe's PRIME under hybridflow (see ``main_prime.py``); ``main`` is its entry point, imported on first use
(so ``python -m hybridflow.recipe.prime.main_prime`` does not find the module already imported)."""

__all__ = ["main"]


def __getattr__(name: str):
    if name == "main":
        from hybridflow.recipe.prime.main_prime import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
