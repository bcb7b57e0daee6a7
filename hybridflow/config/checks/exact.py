"""``actor_rollout_ref.rollout.exact_log_probs``: where exact on-policy log-probs can act."""

from __future__ import annotations

__all__ = ["check_exact_log_probs"]

_KEY = "actor_rollout_ref.rollout.exact_log_probs"


def check_exact_log_probs(cfg, errors: list[str]) -> None:
    arr = cfg.actor_rollout_ref
    rc = arr.rollout
    if rc.exact_log_probs is not True:  # null: resolved where it can act (rollout/hf/checks.py, run stage)
        return
    if rc.name != "hf":
        errors.append(f"{_KEY}=true computes each next-token distribution with the actor's own arithmetic, which the "
                      f"hf engine does; rollout.name={rc.name} runs other kernels. Use rollout.name=hf, or remove the "
                      "key (training/rollout_probs_diff_* reports the mismatch)")
    if not rc.calculate_log_probs:
        errors.append(f"{_KEY}=true makes the rollout's log-probs equal pi_old so the old_log_prob pass can be "
                      "skipped; they are only kept with actor_rollout_ref.rollout.calculate_log_probs=true: set it")
    sp = int(arr.actor.ulysses_sequence_parallel_size or 1)
    if sp > 1:
        errors.append(f"{_KEY}=true needs each row computed whole on one rank, as the rollout computes it; "
                      f"actor.ulysses_sequence_parallel_size={sp} splits rows: set it to 1")
