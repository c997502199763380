"""Tiny configurations of Phi, StableLM, Nemotron and Arcee (tests/test_models.py)."""

CONFIGS: dict[str, dict] = {}
