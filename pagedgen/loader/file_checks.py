"""Checkpoint files checked before their tensors are read. A truncated or corrupt file, or a
quantization pagedgen cannot run, is one CheckpointError naming the file and the tensor, raised
before anything is generated: a ValueError, which the CLI reports in one line (exit 2)."""

import json
import struct
from pathlib import Path


class CheckpointError(ValueError):
    pass


def check_safetensors(path: Path) -> tuple[int, dict[str, dict]]:
    """The byte where path's tensor data starts and its header's tensors by name; raises
    CheckpointError unless the header reads and every tensor's bytes lie within the file (a
    download cut short keeps its header and loses the tensors at the end)."""
    size = path.stat().st_size
    with path.open("rb") as file:
        head = file.read(8)
        (length,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
        if length > size - 8:
            raise CheckpointError(
                f"{path}: not a safetensors file, or cut short: its header would take {length} "
                f"bytes of {size}"
            )
        try:
            header = json.loads(file.read(length))
            ends = {name: int(info["data_offsets"][1]) for name, info in header.items()
                    if name != "__metadata__"}  # fmt: skip
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise CheckpointError(f"{path}: not a safetensors file ({e})") from e
    data_size = size - 8 - length
    for name, end in ends.items():
        if end > data_size:
            raise CheckpointError(
                f"{path}: cut short: tensor {name!r} ends at byte {8 + length + end}, the file "
                f"has {size}"
            )
    header.pop("__metadata__", None)
    return 8 + length, header
