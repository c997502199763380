"""Checkpoints read layer by layer: read_safetensors yields a sharded file's tensors grouped by
layer whatever shard holds them, and the loader packs (here: quantizes) each layer as the stream
moves past it, so that a model quantized at load never holds all its dense weights at once."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import pagedgen.loader.weights as weights
from pagedgen import LLM, SamplingParams
from pagedgen.layers.linear import Linear
from pagedgen.loader.safetensors_files import layer_index, read_safetensors

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def shard_across_layers(source, folder):
    """source's tensors in two shards, every other name in each: each layer spans both."""
    shutil.copytree(source, folder)
    (folder / "model.safetensors").unlink()
    state = load_file(source / "model.safetensors")
    names = sorted(state)
    weight_map = {}
    for i, shard in enumerate((names[::2], names[1::2])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({name: state[name] for name in shard}, folder / file)
        weight_map |= dict.fromkeys(shard, file)
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return state


def test_read_safetensors_gives_every_tensor_grouped_by_layer(tiny_llama_path, tmp_path):
    state = shard_across_layers(tiny_llama_path, tmp_path / "m")
    read = list(read_safetensors(sorted((tmp_path / "m").glob("*.safetensors"))))
    assert sorted(name for name, _ in read) == sorted(state)
    for name, tensor in read:
        assert tensor.dtype == state[name].dtype and torch.equal(tensor, state[name]), name
    order = [layer_index(name) for name, _ in read]
    assert order == sorted(order, key=lambda i: -1 if i is None else i)
    assert order[0] is None and order[-1] == 1


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_each_layer_is_packed_before_the_next_one_loads(
    tiny_llama_path, tmp_path, monkeypatch, quantization
):
    shard_across_layers(tiny_llama_path, tmp_path / "m")
    streamed = weights.packed_as_loaded
    seen: list[tuple[int | None, dict[int, bool]]] = []

    def observed(stream, model, *args):
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
        for name, tensor in streamed(stream, model, *args):
            packed: dict[int, bool] = {}
            for module_name, linear in linears:
                if (i := layer_index(module_name + ".")) is not None:
                    packed[i] = packed.get(i, True) and linear.packed
            seen.append((layer_index(name), packed))
            yield name, tensor

    monkeypatch.setattr(weights, "packed_as_loaded", observed)
    sharded = LLM(str(tmp_path / "m"), quantization=quantization, kv_cache_memory=0.01,
                  log=lambda m: None)  # fmt: skip
    for index, packed in seen:
        for layer, is_packed in packed.items():
            assert is_packed == (index is not None and layer < index), (index, packed)
    assert {index for index, _ in seen} == {None, 0, 1}
    monkeypatch.setattr(weights, "packed_as_loaded", streamed)
    whole = LLM(str(tiny_llama_path), quantization=quantization, kv_cache_memory=0.01,
                log=lambda m: None)  # fmt: skip
    prompt = "The planes import one way"
    assert (
        sharded.generate([prompt], GREEDY)[0].outputs[0].token_ids
        == whole.generate([prompt], GREEDY)[0].outputs[0].token_ids
    )
