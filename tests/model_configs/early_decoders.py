"""Tiny configurations of GPT-Neo, CodeGen, Persimmon, Apertus and HunYuan."""

CONFIGS: dict[str, dict] = {}
