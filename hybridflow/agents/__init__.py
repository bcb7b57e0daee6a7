"""Agent loops: multi-turn rollouts with tools and interactions (see docs/agents.md)."""
