"""The one exception type for bad configuration: it carries every problem found, not just the first."""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid configuration. ``messages`` lists each problem with the key it concerns and the fix."""

    def __init__(self, messages: list[str]):
        self.messages = list(messages)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {m}" for m in self.messages))
