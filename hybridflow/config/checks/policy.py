"""verl keys hybridflow does not act on: refused (a feature it does not have, exit 2) or inert (one note).

The tables live in :mod:`hybridflow.config.key_policy` (and, generated from it, in ``docs/migrating-from-verl.md``).
"""

from __future__ import annotations

from hybridflow.config.key_policy import inert_note, refusal_errors

__all__ = ["check_inert_keys", "check_refused_keys"]


def check_refused_keys(cfg, errors: list[str]) -> None:
    errors.extend(refusal_errors(cfg))


def check_inert_keys(cfg, errors: list[str], notes: list[str]) -> None:
    note = inert_note(cfg)  # every inert key the command line set, in one note
    if note:
        notes.append(note)
