"""Where pagedgen keeps what it makes once and reuses: converted models and built kernels."""

from pathlib import Path

from pagedgen import envs


def cache_dir() -> Path:
    return envs.pagedgen_cache() or envs.xdg_cache_home() / "pagedgen"
