"""Weights from the trainer to the engines: the checkpoint engine and bucketed transfer, shared by every engine."""
