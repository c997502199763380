"""benchmarks/random_models.py: the presets have the real models' shapes, and a scaled-down one
built on the CPU loads into pagedgen and transformers, which agree on its greedy tokens."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from pagedgen import LLM, SamplingParams
from tests.models.test_models import reference_greedy

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "random_models.py"
spec = importlib.util.spec_from_file_location("random_models", SCRIPT)
random_models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(random_models)

# Parameter counts of the published checkpoints (a tied lm_head counted once).
NUM_PARAMETERS = {
    "smollm2-135m": 134_515_008,
    "llama-1b": 1_235_814_400,
    "llama-8b": 8_030_261_248,
    "deepseek-v2-lite": 15_706_484_224,  # experts saved one by one, as the release has them
    "gpt2": 124_439_808,
    "opt-125m": 125_239_296,
    "pythia-160m": 162_322_944,
    "bloom-560m": 559_214_592,
}


@pytest.mark.parametrize("preset", sorted(NUM_PARAMETERS))
def test_presets_have_the_real_parameter_counts(preset):
    shapes = random_models.weight_shapes(random_models.model_config(preset))  # meta: no memory
    assert sum(shape.numel() for shape in shapes.values()) == NUM_PARAMETERS[preset]
    tied = random_models.PRESETS[preset]["tie_word_embeddings"]
    heads = [name for name in shapes if name in ("lm_head.weight", "embed_out.weight")]  # NeoX's
    assert bool(heads) != tied


def test_the_smollm2_preset_matches_the_real_config(smollm2_path):
    real = json.loads((smollm2_path / "config.json").read_text())
    ours = random_models.model_config("smollm2-135m").to_dict()
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads"):
        assert ours[key] == real[key], key
    for key in ("num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings"):
        assert ours[key] == real[key], key
    assert ours["rope_parameters"]["rope_theta"] == real["rope_parameters"]["rope_theta"]


def test_plan_shards_keeps_each_shard_under_the_limit():
    shapes = {"a": torch.Size([4, 4]), "b": torch.Size([4, 4]), "c": torch.Size([8, 4])}
    assert random_models.plan_shards(shapes, 4, 128) == [["a", "b"], ["c"]]
    assert random_models.plan_shards(shapes, 4, 16) == [["a"], ["b"], ["c"]]  # one too big alone


def greedy_hf(folder: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return [reference_greedy(model, prompt, max_tokens) for prompt in prompts]


def test_a_tiny_sharded_model_loads_in_pagedgen_and_transformers(tiny_llama_path, tmp_path):
    """A vocabulary (49152) far past the tokenizer's (257 byte tokens): token-id prompts may use
    any id below vocab_size, and outputs past the tokenizer decode to no text."""
    folder = random_models.build(
        "tiny",
        tmp_path / "tiny",
        dtype="float32",
        tokenizer=tiny_llama_path,
        max_shard_bytes=1 << 20,
    )
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    config = json.loads((folder / "config.json").read_text())
    assert config["eos_token_id"] == 256 and config["vocab_size"] == 49152
    prompts = [[1, 2, 3, 4], [40000, 7, 49151], [300, 12]]
    llm = LLM(str(folder), log=lambda message: None, dtype="float32", kv_cache_memory=0.01)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert all(out.error is None for out in outputs)
    ours = [list(out.outputs[0].token_ids) for out in outputs]
    assert all(len(ids) == 6 for ids in ours)
    assert ours == greedy_hf(folder, prompts, 6)


def test_the_cli_builds_a_scaled_down_smollm2_with_its_tokenizer(smollm2_path, tmp_path):
    out = tmp_path / "smollm2"
    random_models.main(["smollm2-135m", str(out), "--layers", "2", "--dtype", "bfloat16"])
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["dtype"]) == (
        2, 576, "bfloat16",
    )  # fmt: skip
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    llm = LLM(str(out), log=lambda message: None, dtype="bfloat16", kv_cache_memory=0.01)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate([[1, 2, 3], "Hello"], params)
    assert [len(out.outputs[0].token_ids) for out in outputs] == [4, 4]
