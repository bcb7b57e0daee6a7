"""The vLLM engine: in-process (colocated) engine, its driver thread, OpenAI-server replicas, config mapping, images."""
