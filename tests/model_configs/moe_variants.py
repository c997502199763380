"""Tiny configurations of the newer mixtures of experts (tests/test_models.py)."""

CONFIGS: dict[str, dict] = {}
