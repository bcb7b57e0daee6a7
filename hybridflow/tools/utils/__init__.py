"""verl's ``verl.tools.utils`` package: the tool-config loader lives in :mod:`.tool_registry`."""
