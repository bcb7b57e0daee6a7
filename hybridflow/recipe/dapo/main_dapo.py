"""verl-recipe's DAPO entry point: ``python -m hybridflow.recipe.dapo.main_dapo key=value ...``.

DAPO's parts are built into hybridflow's trainer: decoupled clipping (``actor.clip_ratio_low/high``), dynamic
sampling (``algorithm.filter_groups.*``, with ``data.gen_batch_size`` prompts per round), token-mean loss
aggregation (``actor.loss_agg_mode``) and the overlong reward shaping of the ``dapo`` reward manager
(``reward_model.reward_kwargs.overlong_buffer_cfg.*``).  So the recipe's entry point is the trainer's own with the
recipe's config, ``dapo_trainer`` (``hybridflow/config/dapo_trainer.yaml``: the reward manager ``dapo``, the overlong
buffer and dynamic sampling present and off, ``data.gen_batch_size`` following ``data.train_batch_size``).  The
same run is ``hybridflow train --config-name dapo_trainer ...``; ``--config-path/--config-name`` pointing at verl's
own ``dapo_trainer.yaml`` (either layout: ``reward.reward_kwargs.overlong_buffer_cfg`` or the first recipe's
``reward_model.overlong_buffer``) work as well.
"""

from __future__ import annotations

import sys

from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name

CONFIG_NAME = "dapo_trainer"


def main(argv: list[str] | None = None) -> int:
    from hybridflow.trainer.main_ppo import main as train_main

    return train_main(with_config_name(list(sys.argv[1:] if argv is None else argv), CONFIG_NAME))


if __name__ == "__main__":
    sys.exit(main())
