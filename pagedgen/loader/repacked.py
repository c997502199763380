"""A folder of weights kept quantized (a converted GGUF file): model.safetensors holds each
QuantizedWeight as <name>.qweight, <name>.scales and <name>.mins (where it has them), beside the
dense tensors, and quantized_weights.json lists them with their bits and group size.

    {"format": 1, "weights": {"model.layers.0.mlp.down_proj.weight": {"bits": 4, "group_size": 32,
                                                                     "mins": true}, ...}}

Read back, the stream gives (name, QuantizedWeight) for each; loaded_weights then decides, per
weight, what a model's load_weights gets."""

import json
import math
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from pagedgen.layers.linear import Linear
from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.loader.file_checks import CheckpointError
from pagedgen.models.checkpoint_weights import fused_module

QUANTIZED_WEIGHTS = "quantized_weights.json"
FORMAT = 1
PARTS = ("qweight", "scales", "mins")
SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int8: "I8",
    torch.uint8: "U8",
}

Weight = QuantizedWeight | torch.Tensor


def save_repacked(
    weights: Iterable[tuple[str, Weight]], folder: Path, source: Path | None = None
) -> None:
    """Writes weights into folder's model.safetensors and quantized_weights.json (with source,
    the file they came from), a weight at a time (write_safetensors)."""
    layout: dict[str, dict] = {}

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, weight in weights:
            if not isinstance(weight, QuantizedWeight):
                yield name, weight
                continue
            layout[name] = {
                "bits": weight.bits,
                "group_size": weight.group_size,
                "mins": weight.mins is not None,
            }
            for part in PARTS:
                if getattr(weight, part) is not None:
                    yield f"{name}.{part}", getattr(weight, part)

    write_safetensors(tensors(), folder / "model.safetensors")
    saved = {"format": FORMAT, "source": None if source is None else str(source)}
    text = json.dumps({**saved, "weights": layout}, indent=1)
    (folder / QUANTIZED_WEIGHTS).write_text(text + "\n")


def write_safetensors(tensors: Iterable[tuple[str, torch.Tensor]], path: Path) -> None:
    """A safetensors file written a tensor at a time: each one's bytes go to a scratch file as it
    comes, then behind the header that lists them all, so that no more than one tensor is held
    (a whole 8B model would be ~6 GB quantized, 32 GB in float32)."""
    entries: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    with tempfile.TemporaryFile(dir=path.parent) as data:
        for name, tensor in tensors:
            start = data.tell()
            data.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            entries[name] = {
                "dtype": SAFETENSORS_DTYPES[tensor.dtype],
                "shape": list(tensor.shape),
                "data_offsets": [start, data.tell()],
            }
        header = json.dumps(entries, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)  # the data 8-byte aligned, as safetensors writes it
        with path.open("wb") as file:
            file.write(struct.pack("<Q", len(header)) + header)
            data.seek(0)
            shutil.copyfileobj(data, file, 1 << 24)


def is_repacked(folder: Path) -> bool:
    return (folder / QUANTIZED_WEIGHTS).is_file()


def _saved(folder: Path) -> tuple[dict[str, tuple[int, int, bool]], str | None]:
    """quantized_weights.json: (bits, group size, mins) by weight, and the source file."""
    path = folder / QUANTIZED_WEIGHTS
    try:
        saved = json.loads(path.read_text())
        if saved.get("format") != FORMAT:
            raise ValueError(f"format {saved.get('format')!r}, not {FORMAT}")
        layout = {name: (int(w["bits"]), int(w["group_size"]), bool(w["mins"]))
                  for name, w in saved["weights"].items()}  # fmt: skip
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CheckpointError(f"{path}: not a list of quantized weights ({e})") from e
    return layout, saved.get("source")


def source_file(folder: Path) -> Path | None:
    """The file a folder of quantized weights came from, as it was when converted."""
    source = _saved(folder)[1]
    return None if source is None else Path(source)


def num_elements(folder: Path) -> int:
    """How many weight elements a folder of quantized weights holds, as transformers would
    hold them dequantized, from its safetensors header (no tensor is read)."""
    layout = _saved(folder)[0]
    count = 0
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            prefix, _, part = name.rpartition(".")
            if prefix in layout and part in PARTS[1:]:
                continue  # a quantized weight's scales and mins
            size = math.prod(f.get_slice(name).get_shape())
            count += size * 2 if prefix in layout and layout[prefix][0] == 4 else size
    return count


def read_repacked(
    folder: Path, tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, Weight]]:
    """The folder's tensors (as iterate_weights reads them) with each quantized weight's parts
    gathered into its QuantizedWeight."""
    path = folder / QUANTIZED_WEIGHTS
    layout = _saved(folder)[0]
    found: dict[str, dict[str, torch.Tensor]] = {}
    done: set[str] = set()
    for name, tensor in tensors:
        prefix, _, part = name.rpartition(".")
        if prefix not in layout or part not in PARTS:
            yield name, tensor
            continue
        parts = found.setdefault(prefix, {})
        parts[part] = tensor
        bits, group_size, has_mins = layout[prefix]
        if len(parts) == 2 + has_mins:
            yield prefix, _quantized(path, prefix, bits, group_size, found.pop(prefix))
            done.add(prefix)
    missing = sorted(set(layout) - done)
    if missing:
        raise CheckpointError(f"{folder}: {missing[0]!r} lacks some of its parts {PARTS}")


def _quantized(
    path: Path, name: str, bits: int, group_size: int, parts: dict[str, torch.Tensor]
) -> QuantizedWeight:
    try:
        qweight, scales = parts["qweight"], parts["scales"]
        return QuantizedWeight(bits, group_size, qweight, scales, parts.get("mins"))
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: {name!r}: {e}") from e


def loaded_weights(
    weights: Iterable[tuple[str, Weight]],
    model: nn.Module,
    dtype: torch.dtype,
    keep_quantized: bool,
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """What the model's load_weights reads: with keep_quantized, each QuantizedWeight of a
    linear layer as it is, and the token embedding's of a model with an LM head (which, tied,
    computes on the embedding's integers as llama.cpp does; load_checkpoint_weights
    dequantizes it for the embedding); every other QuantizedWeight (all of them without
    keep_quantized) dequantized into dtype as it streams; dense tensors as they are."""
    modules = dict(model.named_modules()) if keep_quantized else {}
    for name, weight in weights:
        if isinstance(weight, QuantizedWeight) and not (
            _is_linear(modules, name) or _is_tied_embedding(modules, name)
        ):
            weight = weight.dequantize().to(dtype)
        yield name, weight


def _is_tied_embedding(modules: dict[str, nn.Module], name: str) -> bool:
    return name.removeprefix("model.") == "embed_tokens.weight" and isinstance(
        modules.get("lm_head"), Linear
    )


def _is_linear(modules: dict[str, nn.Module], name: str) -> bool:
    """Whether name is the weight of a Linear of the model (a fused projection's shard, too)."""
    module_name, _, param = name.removeprefix("model.").rpartition(".")
    module = modules.get(fused_module(module_name)[0], modules.get(module_name))
    return param == "weight" and isinstance(module, Linear)
