"""The rollout service: servers hosting an engine on their own event loop, replicas, fleets, the server manager (routing), server processes."""
