"""verl's ``verl.experimental.fully_async_policy``: ``python -m hybridflow.experimental.fully_async_policy.fully_async_main``.

The controller is the fully async mode (``hybridflow/trainer/modes/fully_async.py``) (rollouter and queue in
``hybridflow.trainer.asynchronous.rollouter`` / ``sample_queue``); this package keeps verl's entry point and config name
(``fully_async_ppo_trainer``)."""
