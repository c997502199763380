"""Tiny configurations of the Llama, Gemma and Granite variants (tests/test_models.py)."""

CONFIGS: dict[str, dict] = {}
