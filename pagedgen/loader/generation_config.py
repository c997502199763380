"""The sampling defaults a model's creator recommends, read as vLLM reads them (its
generation_config="auto"): the non-default fields of the model's generation_config.json (or of
its config.json where it has none), then override_generation_config on top."""

from pathlib import Path
from typing import Any

# The generation config fields vLLM takes as sampling defaults; max_new_tokens is max_tokens.
SAMPLING_KEYS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)


def model_sampling_defaults(
    model_dir: Path, generation_config: str = "auto", overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """SamplingParams fields: "auto" reads model_dir's generation config, "vllm" none (vLLM's
    neutral defaults), anything else is a folder holding a generation_config.json."""
    config = _generation_fields(model_dir, generation_config, overrides)
    fields = {key: config[key] for key in SAMPLING_KEYS if config.get(key) is not None}
    if "max_new_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_new_tokens")
    return fields


def generation_eos_token_ids(
    model_dir: Path, generation_config: str = "auto", overrides: dict[str, Any] | None = None
) -> set[int]:
    """The end-of-sequence ids of the same generation config: chat models list their end of
    turn there (Llama 3's <|eot_id|>, Gemma's <end_of_turn>), which vLLM stops at as at EOS."""
    ids = _generation_fields(model_dir, generation_config, overrides).get("eos_token_id")
    if ids is None:
        return set()
    return {ids} if isinstance(ids, int) else set(ids)


def _generation_fields(
    model_dir: Path, generation_config: str, overrides: dict[str, Any] | None
) -> dict[str, Any]:
    if generation_config == "vllm":
        config: dict[str, Any] = {}
    elif generation_config == "auto":
        config = _non_default_fields(model_dir)
    else:
        folder = Path(generation_config)
        if not (folder / "generation_config.json").is_file():
            raise ValueError(f"generation_config: no generation_config.json in {folder}")
        from transformers import GenerationConfig

        config = GenerationConfig.from_pretrained(folder).to_diff_dict()
    config.update(overrides or {})
    return config


def _non_default_fields(model_dir: Path) -> dict[str, Any]:
    from transformers import GenerationConfig, PretrainedConfig

    try:
        return GenerationConfig.from_pretrained(model_dir).to_diff_dict()
    except OSError:  # no generation_config.json: the generation fields of config.json, if any
        try:
            # as plain JSON: a config class of the model's own code need not run for this
            config = PretrainedConfig.from_json_file(model_dir / "config.json")
            return GenerationConfig.from_model_config(config).to_diff_dict()
        except OSError:
            return {}
