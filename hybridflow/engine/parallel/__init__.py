"""Parallelism of the training engine: the dimensions a role is split along and the rules that check them."""
