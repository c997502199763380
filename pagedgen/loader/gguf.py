"""GGUF files: the metadata as a Hugging Face config and tokenizer (transformers reads them), the
tensors under their Hugging Face names, memory-mapped, the quantized ones repacked into
QuantizedWeight (gguf_blocks.py) rather than dequantized, and the conversion into the cache
folder that runs load from (repacked.py writes and reads it)."""

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.loader.file_checks import CheckpointError
from pagedgen.loader.gguf_blocks import DENSE, REPACK, TYPES, repack
from pagedgen.loader.repacked import Weight, save_repacked
from pagedgen.models.registry import get_model_class

if TYPE_CHECKING:
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor


class _CheckedReader(GGUFReader):
    """GGUFReader, with each tensor's type and extent checked before it is mapped: a file cut
    short names the first tensor it lost (GGUFReader's own error is a failed reshape)."""

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        for field in fields:
            _, name, _, dims, raw_type, offset = field.parts
            name = bytes(name).decode("utf-8", "replace")
            try:
                block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type[0]))]
            except ValueError as e:
                raise CheckpointError(f"tensor {name!r} has an unknown type ({e})") from e
            end = start_offs + int(offset[0]) + int(np.prod(dims)) // block_size * type_size
            if end > len(self.data):
                raise CheckpointError(
                    f"cut short: tensor {name!r} ends at byte {end}, the file has {len(self.data)}"
                )
        super()._build_tensors(start_offs, fields)


def open_gguf(path: Path) -> GGUFReader:
    """The file's reader (its tensors memory-mapped), or CheckpointError naming the file and,
    where one is at fault, the tensor: not GGUF, cut short, or of a type pagedgen cannot take."""
    try:
        reader = _CheckedReader(path)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from e
    except (ValueError, IndexError, OverflowError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a GGUF file, or a corrupt one ({e})") from e
    for tensor in reader.tensors:
        if tensor.tensor_type not in REPACK and tensor.tensor_type not in DENSE:
            raise CheckpointError(
                f"{path}: tensor {tensor.name!r} is {tensor.tensor_type.name}: pagedgen runs "
                f"{TYPES} and F32 / F16 / BF16 GGUF tensors"
            )
    return reader


def gguf_weights(
    path: Path, config: PretrainedConfig, reader: GGUFReader | None = None
) -> Iterator[tuple[str, Weight]]:
    """The file's tensors under their Hugging Face names: each 2-D quantized one a
    QuantizedWeight, the others (norms, biases: F32) dense, as stored.

    transformers supplies the name map (a weightless model on the meta device) and, per
    architecture, what it does to each tensor: Llama's q/k rows put back in Hugging Face's order
    is a permutation of output rows, which moves a QuantizedWeight's rows (its groups run along
    the input). An architecture whose processing is more than that (Gemma's norms less one,
    merged experts, BLOOM's fused qkv) loads dequantized, as transformers loads it."""
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    reader = reader or open_gguf(path)
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    if type(processor) not in (TensorProcessor, LlamaTensorProcessor):
        yield from _dequantized(path, config)
        return
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    hf_names = get_gguf_hf_weights_map(_TopLevel(skeleton), processor)
    if not set(hf_names.values()) >= set(skeleton.state_dict()):
        hf_names = get_gguf_hf_weights_map(skeleton, processor)  # submodules' names, too
    for tensor in reader.tensors:
        if tensor.name in hf_names:
            yield hf_names[tensor.name], _weight(tensor, processor)


class _TopLevel:
    """A model's own parameter names without its submodules': get_gguf_hf_weights_map builds
    a name table for each module it recurses into (seconds for a 30-layer model), and a
    decoder's top-level names already name every parameter (BLOOM's need its submodules')."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.config = model.config
        self.state_dict = model.state_dict

    def named_children(self) -> Iterator[tuple[str, torch.nn.Module]]:
        return iter(())


def _weight(tensor: ReaderTensor, processor: "TensorProcessor") -> Weight:
    qtype = tensor.tensor_type
    if qtype in REPACK and len(tensor.shape) == 2:
        n, k = (int(d) for d in reversed(tensor.shape.tolist()))
        rows = processor.process(weights=np.arange(n).reshape(n, 1), name=tensor.name).weights
        return _rows(repack(tensor.data, qtype, (n, k)), torch.from_numpy(rows.reshape(n)))
    array = processor.process(weights=dequantize(tensor.data, qtype), name=tensor.name).weights
    return torch.from_numpy(np.array(array, dtype=np.float32)).to(DENSE.get(qtype, torch.float32))


def _rows(weight: QuantizedWeight, order: torch.Tensor) -> QuantizedWeight:
    """weight's output rows in order: row i is weight's row order[i]."""
    if torch.equal(order, torch.arange(len(order))):
        return weight
    mins = None if weight.mins is None else weight.mins[order]
    return QuantizedWeight(
        weight.bits, weight.group_size, weight.qweight[order], weight.scales[order], mins
    )


def _dequantized(path: Path, config: PretrainedConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in float32, as transformers loads the file."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    yield from parsed["tensors"].items()


def read_gguf_config(path: Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights load as QuantizedWeight or dense, not HF's
    return config


def convert_gguf(path: Path, target: Path, on_start: Callable[[], None] = lambda: None) -> None:
    """Writes an HF folder (config, tokenizer, the repacked weights) for a GGUF file, atomically.
    A file that is not GGUF, is cut short, or holds a type pagedgen cannot run, and an
    architecture we do not implement, are refused after reading the metadata only; on_start
    runs once they have passed."""
    reader = open_gguf(path)
    config = read_gguf_config(path)
    get_model_class(config)
    on_start()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        save_repacked(gguf_weights(path, config, reader), staging, path.resolve())
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
