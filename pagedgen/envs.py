"""Every environment variable pagedgen reads, read here and only when asked (never at import
time), as vLLM's envs.py. Options belong in EngineConfig and on the command line; what is left
here is where files go and switches for debugging. docs/configuration.md lists them."""

import os
from pathlib import Path


def pagedgen_cache() -> Path | None:
    """PAGEDGEN_CACHE: where converted models and built kernels go (else $XDG_CACHE_HOME or
    ~/.cache, then pagedgen)."""
    value = os.environ.get("PAGEDGEN_CACHE")
    return Path(value) if value else None


def xdg_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
