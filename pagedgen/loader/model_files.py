"""A model folder's config and tokenizer, read without importing transformers.models where we
can: touching that package (any Auto* class or model config class) indexes every model
transformers ships, ~2 s of every start-up."""

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from pagedgen.loader.resolve import ResolvedModel

# transformers' defaults, per model type, for the config fields our decoders read and a
# config.json may leave out (tests/loader/test_loader.py checks them against the config classes).
CONFIG_DEFAULTS: dict[str, dict] = {
    "llama": {
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "mistral": {
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen2": {
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "num_key_value_heads": 32,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "qwen3": {
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
    },
}
REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
FAST_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_config(
    resolved: ResolvedModel,
    trust_remote_code: bool = False,
    hf_overrides: dict[str, Any] | None = None,
) -> PretrainedConfig:
    """The checkpoint's config, hf_overrides' fields set over it (vLLM's hf_overrides)."""
    config = _checkpoint_config(resolved, trust_remote_code)
    for key, value in (hf_overrides or {}).items():
        setattr(config, key, value)
    return config


def _checkpoint_config(resolved: ResolvedModel, trust_remote_code: bool) -> PretrainedConfig:
    if resolved.gguf_file:
        from pagedgen.loader.gguf import read_gguf_config

        return read_gguf_config(resolved.path / resolved.gguf_file)
    config = read_plain_config(resolved.path / "config.json")
    if config is not None:
        return config
    from transformers import AutoConfig

    with _remote_code_refused(resolved.path, "config"):
        return AutoConfig.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)


@contextlib.contextmanager
def _remote_code_refused(path: Path, what: str) -> Iterator[None]:
    """transformers' refusal to run a folder's own code, said in pagedgen's options."""
    try:
        yield
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise ValueError(
            f"{path}: its {what} is the model's own Python code (auto_map); pass "
            "--trust-remote-code (trust_remote_code=True) to run it, if you trust its source"
        ) from e


def read_plain_config(path: Path) -> PretrainedConfig | None:
    """config.json as a PretrainedConfig, with the defaults of its model type's class for what it
    leaves out, when it is one of ours with plain rotary embeddings; else None (the caller then
    asks AutoConfig, whose classes also standardize scaled rope parameters)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    defaults = CONFIG_DEFAULTS.get(data.get("model_type"))
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if defaults is None or rope_type != "default" or not all(f in data for f in REQUIRED_FIELDS):
        return None
    fields = {"num_key_value_heads": data["num_attention_heads"], **defaults, **data}
    return PretrainedConfig.from_dict(fields)


def load_tokenizer(
    resolved: ResolvedModel, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The fast tokenizer class directly when the folder names it (AutoTokenizer would import
    transformers.models to find it), else AutoTokenizer."""
    path = resolved.path
    if not resolved.gguf_file and (path / "tokenizer.json").is_file():
        try:
            settings = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            settings = {}
        if settings.get("tokenizer_class") in FAST_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    with _remote_code_refused(path, "tokenizer"):
        return AutoTokenizer.from_pretrained(
            path, gguf_file=resolved.gguf_file, trust_remote_code=trust_remote_code
        )
