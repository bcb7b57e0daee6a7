"""The ``hf`` engine: transformers model, continuous batcher, slot KV cache, prefix pool, lean decode step."""
