"""Model engine: device abstraction, HF loading (+LoRA), FSDP2, micro-batching, log-prob forward,
optimizer + schedule, offload and checkpoints. Workers import from the submodules directly."""
