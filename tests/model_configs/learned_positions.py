"""Tiny configurations of GPT-2, GPT-BigCode (StarCoder) and OPT: learned absolute positions."""

CONFIGS: dict[str, dict] = {}
