"""The unit of each metric family, under verl's names: what a chart's axis says and what ``timing_s/`` may hold.

``timing_s/<name>`` is a wall-clock duration in seconds and nothing else: the stages the controller times
(verl's ``gen``, ``reward``, ``old_log_prob``, ``ref``, ``values``, ``adv``, ``update_critic``,
``update_actor``, ``update_weights``, ``step``, ``testing``...) and verl's agent-loop timings
(``agent_loop/{generate_sequences,tool_calls,compute_score}/{min,max,mean}`` and ``agent_loop/slowest/*`` of those).
Counts and lengths that verl's agent loop reports beside its timings (the slowest trajectory's
``prompt_length`` / ``response_length``, ``num_preempted``) are logged without the ``timing_s/`` prefix, under
the agent-loop name verl gives them (``agent_loop/slowest/prompt_length``: tokens).

``DURATION_STAGES`` lists every name that may follow ``timing_s/``; ``tests/agents/test_user_tool_run.py`` and
``tests/agents/test_agent_loops.py`` check every ``timing_s/*`` metric of real runs against it.
"""

from __future__ import annotations

__all__ = ["DURATION_STAGES", "UNITS", "is_duration", "unit_of"]

_AGENT_TIMED = ("generate_sequences", "tool_calls", "compute_score")
DURATION_STAGES: frozenset[str] = frozenset({
    # the synchronous step (trainer/ppo_trainer.py, trainer/stages.py) and its optional stages
    "gen", "gen_max", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
    "update_weights", "update_ref", "update_reward_model", "filter", "teacher", "pairs", "save_checkpoint", "step",
    "testing",
    # asynchronous controllers (trainer/asynchronous/): the generation a batch took, the pauses and weight pushes
    "generate_async", "pause_rollout", "param_sync",
    *(f"agent_loop/{name}/{stat}" for name in _AGENT_TIMED for stat in ("min", "max", "mean")),
    *(f"agent_loop/slowest/{name}" for name in _AGENT_TIMED),
})

# (metric name or prefix ending in "/", unit), first match wins: the y-axis label of the report's charts
UNITS: tuple[tuple[str, str], ...] = (
    ("timing_s/", "seconds"),
    ("timing_per_token_ms/", "ms / token"),
    ("agent_loop/slowest/prompt_length", "tokens"),
    ("agent_loop/slowest/response_length", "tokens"),
    ("response_length/clip_ratio", "fraction"),
    ("prompt_length/clip_ratio", "fraction"),
    ("response_length/", "tokens"),
    ("prompt_length/", "tokens"),
    ("perf/throughput", "tokens / s / device"),
    ("perf/total_num_tokens", "tokens"),
    ("perf/time_per_step", "seconds"),
    ("perf/mfu/", "fraction of peak"),
    ("perf/max_memory_allocated_gb", "GiB"),
    ("perf/max_memory_reserved_gb", "GiB"),
    ("perf/cpu_memory_used_gb", "GiB"),
    ("actor/entropy", "nats / token"),
    ("actor/ppo_kl", "nats"),
    ("actor/kl_loss", "nats"),
    ("actor/reward_kl_penalty", "nats"),
    ("actor/lr", "learning rate"),
    ("critic/lr", "learning rate"),
    ("agent/model_tokens/", "tokens"),
    ("agent/observation_tokens/", "tokens"),
)


def unit_of(name: str) -> str | None:
    """The unit of metric ``name`` (None where the family has none worth an axis label)."""
    for key, unit in UNITS:
        if name == key or (key.endswith("/") and name.startswith(key)):
            return unit
    return None


def is_duration(name: str) -> bool:
    """True for ``timing_s/<stage>`` with a stage the controller or the agent loop times."""
    return name.startswith("timing_s/") and name.removeprefix("timing_s/") in DURATION_STAGES
