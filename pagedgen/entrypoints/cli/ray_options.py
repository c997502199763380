"""`run`'s options for scaling out on Ray Data, built into one RayOptions."""

import functools
from dataclasses import dataclass

from pagedgen.entrypoints.cli.options import RAY_PANEL, OptionGroup, option

OUTPUT_FORMATS = ("jsonl", "parts")
FLAGS = {
    "address": "--ray-address",
    "replicas": "--replicas",
    "batch_size": "--batch-size",
    "output_format": "--output-format",
}

_ray = functools.partial(option, RAY_PANEL)


@dataclass(slots=True)
class RayOptions:
    enabled: bool = False
    address: str | None = None  # None: a local cluster started for the run
    replicas: int = 1
    batch_size: int = 64
    output_format: str = "jsonl"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.output_format not in OUTPUT_FORMATS:
            raise ValueError(
                f"output_format must be one of {OUTPUT_FORMATS}, got {self.output_format!r}"
            )
        if not self.enabled:
            default = RayOptions(enabled=True)
            for name, flag in FLAGS.items():
                if getattr(self, name) != getattr(default, name):
                    raise ValueError(f"{flag} needs --ray")


def _build(**kwargs: object) -> RayOptions:
    names = {"ray": "enabled", "ray_address": "address"}
    return RayOptions(**{names.get(k, k): v for k, v in kwargs.items()})  # type: ignore[arg-type]


RAY = OptionGroup(
    "scale",
    _build,
    {
        "ray": (bool, _ray(False, "--ray", help="run on a Ray cluster's replicas [default: off]")),
        "ray_address": (
            str | None,
            _ray(
                None,
                help="the cluster to join (as ray.init's address; 'auto' = the one on this "
                "node) [default: start a local one]",
                metavar="ADDR",
            ),
        ),
        "replicas": (int, _ray(1, help="replicas, each holding one model", metavar="N")),
        "batch_size": (int, _ray(64, help="rows handed to a replica at a time", metavar="N")),
        "output_format": (
            str,
            _ray(
                "jsonl",
                help="jsonl: OUTPUT is one file; parts: a folder of part files "
                "('pagedgen merge' joins them)",
                metavar="F",
            ),
        ),
    },
)

__all__ = ["RAY", "RayOptions"]
