"""verl's ``verl.experimental.one_step_off_policy``: ``python -m hybridflow.experimental.one_step_off_policy.main_ppo``.

The controller is the one-step-off mode (``hybridflow/trainer/modes/one_step_off.py``); this package only keeps verl's
entry point and config name (``one_step_off_ppo_trainer``)."""
