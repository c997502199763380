"""A checkpoint's safetensors files read tensor by tensor into memory of the process's own, in
layer order.

Each tensor is read (readinto) into a fresh tensor rather than viewed through a memory map, so
no page of the files counts in the process's resident memory: loading holds the model being
built, not the model plus the files it comes from (an 8B checkpoint's 16 GB). The order is the
tensors without a layer number first (embeddings, final norm, LM head), then layer 0, 1, ...,
whichever shard holds each, so that the loader can pack a layer once its last tensor is read
(loader/weights.packed_as_loaded)."""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from pagedgen.loader.file_checks import CheckpointError, check_safetensors

DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "U16": torch.uint16,
    "I16": torch.int16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
# "model.layers.12.mlp.up_proj.weight" (Hugging Face), "layers.12.mlp..." (ours), GPT-2's "h.12."
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")


def layer_index(name: str) -> int | None:
    """The number of the decoder layer a tensor or module name lies in; None outside layers."""
    match = _LAYER.search(name)
    return None if match is None else int(match.group(1))


def layer_order(name: str) -> int:
    """A sort key: tensors outside the layers first, then layer by layer."""
    index = layer_index(name)
    return -1 if index is None else index


@dataclass(frozen=True)
class _Entry:
    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets in the file
    end: int


def read_safetensors(paths: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the files by name, in layer order (see the module docstring). Every
    header is checked before the first tensor is read: a file cut short or not of the format
    is a CheckpointError naming it."""
    entries: list[_Entry] = []
    for path in paths:
        start, header = check_safetensors(path)
        for name, info in header.items():
            begin, end = info["data_offsets"]
            entries.append(
                _Entry(name, path, info["dtype"], tuple(info["shape"]), start + begin, start + end)
            )
    entries.sort(key=lambda entry: layer_order(entry.name))  # stable: a layer keeps file order
    files = {path: path.open("rb") for path in paths}
    try:
        for entry in entries:
            yield entry.name, _read(files[entry.path], entry)
    finally:
        for file in files.values():
            file.close()


def _read(file, entry: _Entry) -> torch.Tensor:
    dtype = DTYPES.get(entry.dtype)
    if dtype is None:  # a dtype this table lacks: safetensors' own reader may know it
        try:
            with safe_open(entry.path, framework="pt") as f:
                return f.get_tensor(entry.name)
        except SafetensorError as e:
            raise CheckpointError(f"{entry.path}: tensor {entry.name!r}: {e}") from e
    tensor = torch.empty(entry.shape, dtype=dtype)
    data = tensor.reshape(-1).view(torch.uint8).numpy()
    if data.nbytes != entry.end - entry.begin:
        raise CheckpointError(
            f"{entry.path}: tensor {entry.name!r}: {entry.dtype} {list(entry.shape)} takes "
            f"{data.nbytes} bytes, the header gives it {entry.end - entry.begin}"
        )
    file.seek(entry.begin)
    if file.readinto(memoryview(data)) != data.nbytes:
        raise CheckpointError(f"{entry.path}: cut short: tensor {entry.name!r}")
    return tensor
