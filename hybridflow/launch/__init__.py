"""The launch path: one way from a loaded config to a running controller (``run.build_run``), the processes and
services it starts role by role (``processes``, ``roles``, ``judge``, ``rollout_service``, ``pools``), and what the
driver builds for it (``inputs``). Entry points call :func:`hybridflow.launch.run.train_ppo`."""
