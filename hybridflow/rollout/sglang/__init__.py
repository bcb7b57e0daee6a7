"""The SGLang engine (GPU machines only)."""
