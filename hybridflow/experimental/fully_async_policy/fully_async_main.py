"""verl's fully async entry point: ``python -m hybridflow.experimental.fully_async_policy.fully_async_main key=value ...``.

The trainer's own entry point with verl's ``fully_async_ppo_trainer`` config (``async_training.*``,
``rollout.*``; ``async_training.mode=fully_async``).  The same run is
``hybridflow train --config-name fully_async_ppo_trainer ...``.
"""

from __future__ import annotations

import sys

from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name

CONFIG_NAME = "fully_async_ppo_trainer"


def main(argv: list[str] | None = None) -> int:
    from hybridflow.trainer.main_ppo import main as train_main

    return train_main(with_config_name(list(sys.argv[1:] if argv is None else argv), CONFIG_NAME))


if __name__ == "__main__":
    sys.exit(main())
