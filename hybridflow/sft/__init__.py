"""Supervised fine-tuning: the trainer and its data (single- and multi-turn)."""
