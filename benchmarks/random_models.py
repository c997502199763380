"""Random-weight models of real shapes, for benchmarks on machines that hold no checkpoint:

    python benchmarks/random_models.py PRESET OUT_DIR \\
        [--device cuda] [--dtype bfloat16] [--layers N] [--tokenizer DIR]

PRESET: smollm2-135m, llama-1b, llama-8b, deepseek-v2-lite, gpt2, opt-125m, pythia-160m,
bloom-560m, tiny.

OUT_DIR becomes a Hugging Face folder (config.json, safetensors shards, a tokenizer) that
pagedgen and transformers both load. Every weight is drawn on --device in --dtype (normal, std
0.02, norms 1), so an 8B model costs seconds on a GPU and never a CPU initialization; each shard
is then copied to the host and written.

The tokenizer is copied from --tokenizer, by default the default model's (SmolLM2-135M-Instruct,
49152 tokens, from the Hugging Face cache or pagedgen's converted copy). The Llama presets'
vocabulary (128256) is larger than that: token-id workloads (`pagedgen bench --workload fixed` or
a workload file) may use every id below the model's vocab_size, text prompts only those the
tokenizer knows, and generated ids past the tokenizer decode to no text.
"""

import argparse
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

LLAMA3_ROPE = {"rope_type": "default", "rope_theta": 500000.0}
LLAMA32_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
PRESETS: dict[str, dict] = {
    "smollm2-135m": dict(  # HuggingFaceTB/SmolLM2-135M
        num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
        head_dim=64, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
        max_position_embeddings=8192, rope_parameters={"rope_type": "default", "rope_theta": 1e5},
    ),
    "llama-1b": dict(  # meta-llama/Llama-3.2-1B
        num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
        max_position_embeddings=131072, rope_parameters=LLAMA32_ROPE,
    ),
    "llama-8b": dict(  # meta-llama/Meta-Llama-3-8B
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
        max_position_embeddings=8192, rope_parameters=LLAMA3_ROPE,
    ),
    "deepseek-v2-lite": dict(  # deepseek-ai/DeepSeek-V2-Lite: MLA, 64 experts (top 6) + 2 shared
        model_type="deepseek_v2", num_hidden_layers=27, hidden_size=2048,
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=10944,
        moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, first_k_dense_replace=1, topk_method="greedy", n_group=1,
        topk_group=1, routed_scaling_factor=1.0, vocab_size=102400, tie_word_embeddings=False,
        max_position_embeddings=163840, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707,
            "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0,
        },
    ),
    "gpt2": dict(  # openai-community/gpt2: learned positions, LayerNorms, Conv1D weights
        model_type="gpt2", n_layer=12, n_embd=768, n_head=12, n_positions=1024,
        vocab_size=50257, tie_word_embeddings=True,
    ),
    "opt-125m": dict(  # facebook/opt-125m, vLLM's quick-start model
        model_type="opt", num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
        ffn_dim=3072, word_embed_proj_dim=768, max_position_embeddings=2048, vocab_size=50272,
        tie_word_embeddings=True,
    ),
    "pythia-160m": dict(  # EleutherAI/pythia-160m: GPT-NeoX's parallel blocks, rotary on 1/4
        model_type="gpt_neox", num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
        intermediate_size=3072, rotary_pct=0.25, max_position_embeddings=2048,
        vocab_size=50304, use_parallel_residual=True, tie_word_embeddings=False,
    ),
    "bloom-560m": dict(  # bigscience/bloom-560m: ALiBi, LayerNorms, a 250,880-token vocabulary
        model_type="bloom", n_layer=24, hidden_size=1024, n_head=16, vocab_size=250880,
        tie_word_embeddings=True,
    ),
    "tiny": dict(  # for tests: SmolLM2's vocabulary, a few small layers
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, vocab_size=49152, tie_word_embeddings=True,
        max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    ),
}  # fmt: skip
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
MAX_SHARD_BYTES = 4 << 30
STD = 0.02


def model_config(preset: str, num_layers: int | None = None) -> PretrainedConfig:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    fields = dict(PRESETS[preset], initializer_range=STD)
    fields.setdefault("rms_norm_eps", 1e-6 if "model_type" in fields else 1e-5)
    if num_layers is not None:
        fields["num_hidden_layers"] = num_layers
    model_type = fields.pop("model_type", "llama")
    # named, as a saved model's config is: vLLM takes a config without it for a pooling model
    architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return AutoConfig.for_model(model_type, architectures=architectures, **fields)


def weight_shapes(config: PretrainedConfig) -> dict[str, torch.Size]:
    """The checkpoint's tensor names and shapes, read from a model built on the meta device (no
    memory) and saved as transformers saves it (experts one by one; a tied lm_head not stored)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = model.state_dict()
    try:  # transformers 5 stacks experts in memory and saves them one by one
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, state)
    except ImportError:
        pass
    shapes = {name: t.shape for name, t in state.items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def plan_shards(
    shapes: dict[str, torch.Size], itemsize: int, max_shard_bytes: int = MAX_SHARD_BYTES
) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    num_bytes = 0
    for name, shape in shapes.items():
        size = shape.numel() * itemsize
        if shards[-1] and num_bytes + size > max_shard_bytes:
            shards.append([])
            num_bytes = 0
        shards[-1].append(name)
        num_bytes += size
    return shards


def random_weights(
    names: list[str],
    shapes: dict[str, torch.Size],
    device: torch.device,
    dtype: torch.dtype,
    generator: torch.Generator,
) -> Iterator[tuple[str, torch.Tensor]]:
    for name in names:
        if re.search(r"(norm|ln_\w*)\.weight$", name):  # LayerNorms' too (GPT-2's ln_1)
            yield name, torch.ones(shapes[name], device=device, dtype=dtype)
        elif name.endswith("e_score_correction_bias"):  # float32, as DeepSeek-V3 keeps it
            yield name, torch.zeros(shapes[name], device=device, dtype=torch.float32)
        else:
            weight = torch.randn(shapes[name], device=device, dtype=dtype, generator=generator)
            yield name, weight.mul_(STD)


def save_random_model(
    config: PretrainedConfig,
    out_dir: Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> None:
    """Writes config.json and the safetensors shards (with an index when there are several)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    config.save_pretrained(out_dir)
    shapes = weight_shapes(config)
    shards = plan_shards(shapes, dtype.itemsize, max_shard_bytes)
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map: dict[str, str] = {}
    total_size = 0
    for i, names in enumerate(shards):
        file = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        tensors = {
            name: weight.cpu()
            for name, weight in random_weights(
                names, shapes, torch.device(device), dtype, generator
            )
        }
        save_file(tensors, out_dir / file, metadata={"format": "pt"})
        total_size += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def copy_tokenizer(source: Path, out_dir: Path) -> PreTrainedTokenizerBase:
    """Copies the tokenizer files of source into out_dir; returns the tokenizer loaded there."""
    from pagedgen.loader.model_files import load_tokenizer
    from pagedgen.loader.resolve import ResolvedModel

    copied = [f for f in TOKENIZER_FILES if (source / f).is_file()]
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
        raise SystemExit(f"error: {source} holds no tokenizer (tokenizer.json or tokenizer.model)")
    for name in copied:
        shutil.copyfile(source / name, out_dir / name)
    return load_tokenizer(ResolvedModel(out_dir))


def default_tokenizer_folder() -> Path:
    from pagedgen.loader.resolve import DEFAULT_MODEL, ModelNotFoundError, resolve_model

    try:
        return resolve_model(DEFAULT_MODEL).path
    except ModelNotFoundError as e:
        raise SystemExit(f"error: no default tokenizer ({e}); give one with --tokenizer DIR") from e


def build(
    preset: str,
    out_dir: Path,
    device: str = "cpu",
    dtype: str = "bfloat16",
    num_layers: int | None = None,
    tokenizer: Path | None = None,
    seed: int = 0,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """The whole folder: tokenizer first (its special ids go into config.json), then weights."""
    config = model_config(preset, num_layers)
    out_dir.mkdir(parents=True, exist_ok=True)
    loaded = copy_tokenizer(tokenizer or default_tokenizer_folder(), out_dir)
    if len(loaded) > config.vocab_size:
        raise SystemExit(
            f"error: the tokenizer has {len(loaded)} tokens, more than {preset}'s vocab_size "
            f"{config.vocab_size}"
        )
    config.bos_token_id = loaded.bos_token_id
    config.eos_token_id = loaded.eos_token_id
    config.pad_token_id = loaded.pad_token_id
    save_random_model(config, out_dir, device, getattr(torch, dtype), seed, max_shard_bytes)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--device", default="cpu", help="where the weights are drawn: cpu, cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--layers", type=int, default=None, help="fewer (or more) layers")
    parser.add_argument("--tokenizer", type=Path, default=None, help="a folder holding one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    build(
        args.preset, args.out_dir, args.device, args.dtype, args.layers, args.tokenizer, args.seed
    )
    print(f"{args.preset} ({args.dtype}, random weights) saved to {args.out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
