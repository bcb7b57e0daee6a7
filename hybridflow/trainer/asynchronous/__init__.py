"""Asynchronous controllers: one-step-off and fully async (rollouter, sample queue, staleness); they reuse the PPO trainer's stages."""
