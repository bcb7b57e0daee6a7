"""Validation beside background generation: its own agent-loop manager over the same replicas.

The async modes keep generating training batches while the trainer validates; agent-loop workers keep routing
state that belongs to one event loop, so validation gets a manager of its own over the same fleet."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["separate_validation_rollout"]


def separate_validation_rollout(run: Run) -> Any:
    """Point the run's validator at a new agent-loop manager over the training fleet; returns the manager
    (``None`` when the run does not validate). The caller shuts it down when the run ends."""
    from hybridflow.agents import AgentLoopManager

    if run.validator is None:
        return None
    train_manager = run.groups.rollout
    manager = AgentLoopManager(run.config, train_manager.fleet, run.config.trainer.backend,
                               tokenizer=run.tokenizer, processor=getattr(train_manager, "processor", None))
    run.validator.groups = dataclasses.replace(run.groups, rollout=manager)
    return manager
