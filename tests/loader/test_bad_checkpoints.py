"""Checkpoints that cannot load: a safetensors or GGUF file cut short or not of its format, a
GGUF type or a group size pagedgen cannot run. Each is one CheckpointError naming the file and
the tensor, and on the command line one line and exit 2, with no output written."""

import json
import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from pagedgen.loader.file_checks import CheckpointError
from pagedgen.loader.weights import iterate_weights
from tests.cli_util import run_in_process, tiny, write_jsonl


def copy_of(tiny_llama_path, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_path, folder)
    return folder


def test_a_safetensors_file_cut_short_names_the_tensor_it_lost(tiny_llama_path, tmp_path):
    folder = copy_of(tiny_llama_path, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size * 2 // 3])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cut short: tensor '.+'"):
        next(iterate_weights(folder))


@pytest.mark.parametrize(
    "content",
    [
        b"\x00" * 3,
        b"garbage that is no safetensors header" * 9,
        b"\x10\0\0\0\0\0\0\0{not json}....",
    ],
    ids=["too short", "garbage", "header not json"],
)
def test_a_file_that_is_not_safetensors_is_named(tiny_llama_path, tmp_path, content):
    folder = copy_of(tiny_llama_path, tmp_path)
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a safetensors file"):
        list(iterate_weights(folder))


def write_gguf(path, tensors: dict[str, tuple[np.ndarray, Q | None]]):
    writer = GGUFWriter(path, "llama")
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_files_that_cannot_load_are_named_with_their_tensor(tmp_path, monkeypatch):
    """Converted before anything is written to the cache: the refusal leaves no folder."""
    from pagedgen.loader import resolve_model

    monkeypatch.setenv("PAGEDGEN_CACHE", str(tmp_path / "cache"))
    norm = (np.ones(256, np.float32), None)
    q2_k = tmp_path / "q2_k.gguf"
    blocks = np.zeros((2, 84), np.uint8)  # 2 rows of a Q2_K block
    write_gguf(q2_k, {"output_norm.weight": norm, "blk.0.attn_q.weight": (blocks, Q.Q2_K)})
    with pytest.raises(
        CheckpointError, match=r"q2_k\.gguf: tensor 'blk\.0\.attn_q\.weight' is Q2_K"
    ):
        resolve_model(str(q2_k))
    q4_0 = tmp_path / "cut.gguf"
    blocks = np.zeros((256, 18 * 8), np.uint8)  # 256 rows of 8 Q4_0 blocks
    write_gguf(q4_0, {"output_norm.weight": norm, "blk.0.attn_q.weight": (blocks, Q.Q4_0)})
    q4_0.write_bytes(q4_0.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: cut short: tensor 'blk\.0\.attn_q"):
        resolve_model(str(q4_0))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGML" + bytes(range(256)) * 4)
    with pytest.raises(CheckpointError, match=r"garbage\.gguf: not a GGUF file"):
        resolve_model(str(garbage))
    assert not list((tmp_path / "cache" / "models").glob("[!.]*"))


def test_a_group_size_the_weight_cannot_take_is_named(tmp_path):
    import torch

    from pagedgen.layers.quantized_weight import QuantizedWeight
    from pagedgen.loader.repacked import QUANTIZED_WEIGHTS, read_repacked, save_repacked

    weight = QuantizedWeight(8, 32, torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 2))
    save_repacked([("model.layers.0.mlp.up_proj.weight", weight)], tmp_path)
    layout = json.loads((tmp_path / QUANTIZED_WEIGHTS).read_text())
    layout["weights"]["model.layers.0.mlp.up_proj.weight"]["group_size"] = 48
    (tmp_path / QUANTIZED_WEIGHTS).write_text(json.dumps(layout))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight': a group"):
        list(read_repacked(tmp_path, iterate_weights(tmp_path)))


@pytest.mark.parametrize("bad", ["safetensors cut short", "gguf not gguf"])
def test_the_cli_says_so_in_one_line_exits_2_and_writes_nothing(
    tiny_llama_path, tmp_path, capsys, monkeypatch, bad
):
    monkeypatch.setenv("PAGEDGEN_CACHE", str(tmp_path / "cache"))
    if bad == "safetensors cut short":
        model = copy_of(tiny_llama_path, tmp_path) / "model.safetensors"
        model.write_bytes(model.read_bytes()[:-4096])
        said = "cut short: tensor"
    else:
        model = tmp_path / "model.gguf"
        model.write_bytes(b"GGUF" + bytes(range(256)) * 4)
        said = "not a GGUF file"
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hello"}])
    out = tmp_path / "out.jsonl"
    folder = model.parent if bad.startswith("safetensors") else model
    code, _, stderr = run_in_process(capsys, "run", str(src), "-o", str(out), *tiny(folder))
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
    assert str(model) in lines[0]
    assert not out.exists()


def test_a_scale_the_int8_weight_cannot_take_is_named():
    import torch

    from pagedgen.loader.quantized import dequantized
    from tests.loader.test_quantized_checkpoints import int8_config

    weights = [
        ("model.layers.0.mlp.up_proj.weight", torch.zeros(4, 64, dtype=torch.int8)),
        ("model.layers.0.mlp.up_proj.weight_scale", torch.ones(4, 3)),  # 64 inputs in 3 groups
    ]
    with pytest.raises(
        CheckpointError, match=r"layers\.0\.mlp\.up_proj: a scale of shape \(4, 3\)"
    ):
        list(dequantized(iter(weights), int8_config("group", 21)))
