"""Tiny configurations of Gemma 1, Cohere (Command R) and Cohere2 (Command R7B, Command A)."""

CONFIGS: dict[str, dict] = {}
