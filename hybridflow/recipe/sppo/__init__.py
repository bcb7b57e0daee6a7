"""verl-recipe's SPPO under hybridflow (see ``main_sppo.py``); ``main`` is its entry point, imported on first use
(so ``python -m hybridflow.recipe.sppo.main_sppo`` does not find the module already imported)."""

__all__ = ["main"]


def __getattr__(name: str):
    if name == "main":
        from hybridflow.recipe.sppo.main_sppo import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
