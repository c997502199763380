"""`--lora-modules NAME=PATH ...`: the adapters a run's input lines may ask for by name."""

import json
from pathlib import Path

from pagedgen.lora.request import LoRARequest


def parse_lora_modules(specs: list[str]) -> dict[str, LoRARequest]:
    """Each NAME=PATH as a LoRARequest, ids 1, 2, ... in order; raises ValueError for a bad
    spec, a repeated name or a folder that is not a PEFT adapter (before any model loads)."""
    paths: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules takes NAME=PATH, got {spec!r}")
        if name in paths:
            raise ValueError(f"--lora-modules names {name!r} twice")
        if not (Path(path) / "adapter_config.json").is_file():
            raise ValueError(f"--lora-modules {name}: {path} has no adapter_config.json")
        paths[name] = path
    return lora_requests(paths)


def lora_requests(paths: dict[str, str]) -> dict[str, LoRARequest]:
    """Adapters by name from their folders, ids 1, 2, ... in order."""
    return {name: LoRARequest(name, i, path) for i, (name, path) in enumerate(paths.items(), 1)}


def max_rank_of(loras: dict[str, LoRARequest]) -> int:
    """The largest rank (adapter_config.json's r) among the adapters; 1 if none."""
    ranks = [1]
    for lora in loras.values():
        config = json.loads((Path(lora.lora_path) / "adapter_config.json").read_text())
        rank = config.get("r")
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"--lora-modules {lora.lora_name}: adapter_config.json has no rank r")
        ranks.append(rank)
    return max(ranks)
