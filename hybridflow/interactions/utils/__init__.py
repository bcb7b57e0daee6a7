"""Loading interactions from their YAML config."""
