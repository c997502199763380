"""Tiny configurations of GPT-NeoX (Pythia), GPT-J, Falcon and StarCoder2 (tests/test_models.py)."""

CONFIGS: dict[str, dict] = {}
