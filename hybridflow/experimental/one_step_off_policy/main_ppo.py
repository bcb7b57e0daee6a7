"""verl's one-step-off entry point: ``python -m hybridflow.experimental.one_step_off_policy.main_ppo key=value ...``.

The trainer's own entry point with verl's ``one_step_off_ppo_trainer`` config (the rollout on its own pool:
``rollout.nnodes`` / ``rollout.n_gpus_per_node``; ``async_training.mode=one_step_off``).  The same run is
``hybridflow train --config-name one_step_off_ppo_trainer ...``.
"""

from __future__ import annotations

import sys

CONFIG_NAME = "one_step_off_ppo_trainer"


def with_config_name(argv: list[str], name: str) -> list[str]:
    """``argv`` with ``--config-name name`` unless it names a config itself."""
    names = ("--config-name", "--config_name", "-cn")
    if any(a in names or a.startswith(tuple(f"{n}=" for n in names)) for a in argv):
        return list(argv)
    return ["--config-name", name, *argv]


def main(argv: list[str] | None = None) -> int:
    from hybridflow.trainer.main_ppo import main as train_main

    return train_main(with_config_name(list(sys.argv[1:] if argv is None else argv), CONFIG_NAME))


if __name__ == "__main__":
    sys.exit(main())
