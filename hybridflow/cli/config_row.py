"""A row of the config reference (``config_reference_rows.py``): keys, documented default, what they do here."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Row", "Section"]


class Row(NamedTuple):
    keys: str  # markdown, as the table shows it
    default: str  # as the table shows it; the help prints each key's value from ppo_trainer.yaml
    text: str  # what it does in hybridflow (markdown)


class Section(NamedTuple):
    name: str  # the heading of docs/config.md the table sits under
    node: str  # the config node its keys are relative to ("" = the root)
    rows: tuple[Row, ...]
