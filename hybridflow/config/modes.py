"""Which controller mode a configuration runs: one table from verl's keys to the mode, and the refusals.

Three independent verl keys pick how batches reach the trainer -- ``trainer.use_v1`` with
``trainer.v1.trainer_mode`` (verl 0.9's V1 trainer), ``async_training.mode`` (the experimental one-step-off and
fully async entry points) and ``trainer.recipe`` (SPIN / PRIME run their stages on the synchronous step). The
table below is the whole mapping; a combination it does not list is refused at config time, naming the keys.
The modes themselves are files of ``hybridflow/trainer/modes/``.
"""

from __future__ import annotations

from hybridflow.config.v1 import v1_mode

__all__ = ["ASYNC_VALIDATION_MODES", "MODE_TABLE", "MODES", "RECIPE_MODES", "check_async_validation",
           "check_mode", "run_mode"]

# (trainer.use_v1, trainer.v1.trainer_mode, async_training.mode) -> mode
MODE_TABLE: dict[tuple[bool, str | None, str], str] = {
    (False, None, "sync"): "sync",
    (False, None, "one_step_off"): "one_step_off",
    (False, None, "fully_async"): "fully_async",
    (True, "sync", "sync"): "v1_sync",
    (True, "colocate_async", "sync"): "v1_colocate_async",
    (True, "separate_async", "sync"): "v1_separate_async",
}
MODES = tuple(MODE_TABLE.values())

# the modes trainer.async_validation acts in: their replicas keep one version's weights while training goes on
ASYNC_VALIDATION_MODES = ("fully_async", "v1_separate_async")

# trainer.recipe -> the modes it runs in (a recipe not listed runs in every mode: SPPO is an estimator and a loss)
RECIPE_MODES: dict[str, tuple[str, ...]] = {"spin": ("sync",), "prime": ("sync",)}


def _keys(cfg) -> tuple[bool, str | None, str]:
    return bool(getattr(cfg.trainer, "use_v1", False)), v1_mode(cfg), str(cfg.async_training.mode)


def run_mode(cfg) -> str:
    """The mode of ``cfg`` (see :data:`MODE_TABLE`); ``ValueError`` naming the keys for a combination it lacks."""
    keys = _keys(cfg)
    mode = MODE_TABLE.get(keys)
    if mode is None:
        use_v1, v1, async_mode = keys
        if use_v1:
            raise ValueError(f"async_training.mode={async_mode} with trainer.use_v1=true: the V1 trainer picks its "
                             "controller with trainer.v1.trainer_mode (sync | colocate_async | separate_async); "
                             "remove async_training.mode, or set trainer.use_v1=false to run the experimental entry "
                             "points")
        raise ValueError(f"async_training.mode={async_mode!r} is not a training mode; choose one of: sync, "
                         "one_step_off, fully_async")
    recipe = cfg.trainer.recipe
    if recipe in RECIPE_MODES and mode not in RECIPE_MODES[recipe]:
        raise ValueError(f"trainer.recipe={recipe} runs its own stages on the synchronous step; this configuration "
                         f"asks for the {mode} mode ({_describe(keys)}): set trainer.use_v1=false and "
                         "async_training.mode=sync, or drop trainer.recipe")
    return mode


def _describe(keys: tuple[bool, str | None, str]) -> str:
    use_v1, v1, async_mode = keys
    return (f"trainer.use_v1=true, trainer.v1.trainer_mode={v1}" if use_v1 else f"async_training.mode={async_mode}")


def check_mode(cfg, errors: list[str]) -> None:
    """The config-time check: the keys name exactly one mode of the table. An unknown value of one key is that key's
    own check's to report (``checks/v1.py``: ``trainer_mode``; ``checks/placement.py``: ``async_training.mode``);
    this one refuses the combinations."""
    use_v1, v1, async_mode = _keys(cfg)
    if v1 not in {k[1] for k in MODE_TABLE} or async_mode not in {k[2] for k in MODE_TABLE}:
        return
    try:
        run_mode(cfg)
    except ValueError as e:
        errors.append(str(e))


def check_async_validation(cfg, errors: list[str]) -> None:
    """``trainer.async_validation`` needs replicas that keep a version's weights while the actor trains on."""
    if not cfg.trainer.async_validation:
        return
    try:
        mode = run_mode(cfg)
    except ValueError:
        return  # check_mode reports it
    if mode not in ASYNC_VALIDATION_MODES:
        errors.append(f"trainer.async_validation=true validates on the rollout replicas while training goes on, which "
                      f"needs replicas that keep one weight version across steps ({', '.join(ASYNC_VALIDATION_MODES)}); "
                      f"this run is {mode} ({_describe(_keys(cfg))}), whose rollout generates with the actor's "
                      "current weights. Set trainer.async_validation=false, or run async_training.mode=fully_async "
                      "(or trainer.v1.trainer_mode=separate_async) with actor_rollout_ref.hybrid_engine=false")
