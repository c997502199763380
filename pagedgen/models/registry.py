"""Architecture name -> our implementation, as vLLM's registry: (module in pagedgen.models,
class), imported only when a checkpoint names it."""

import functools
import importlib

from torch import nn
from transformers import PretrainedConfig

from pagedgen.models.classifier import for_sequence_classification

MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM"),
    "SeedOssForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "SmolLM3ForCausalLM": ("smollm3", "SmolLM3ForCausalLM"),
    "GraniteForCausalLM": ("granite", "GraniteForCausalLM"),
    "MixtralForCausalLM": ("moe", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("moe", "Qwen3MoeForCausalLM"),
    "Qwen2MoeForCausalLM": ("moe", "Qwen2MoeForCausalLM"),
    "OlmoeForCausalLM": ("moe", "OlmoeForCausalLM"),
    "Olmo2ForCausalLM": ("olmo2", "Olmo2ForCausalLM"),
    "Olmo3ForCausalLM": ("olmo2", "Olmo3ForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek", "DeepseekV2ForCausalLM"),
    "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM"),
    "MiniMaxM2ForCausalLM": ("minimax_m2", "MiniMaxM2ForCausalLM"),
    "GlmForCausalLM": ("glm", "GlmForCausalLM"),
    "Glm4ForCausalLM": ("glm", "Glm4ForCausalLM"),
    "Ernie4_5ForCausalLM": ("glm", "Ernie4_5ForCausalLM"),
    "Exaone4ForCausalLM": ("exaone4", "Exaone4ForCausalLM"),
    "GraniteMoeForCausalLM": ("granite_moe", "GraniteMoeForCausalLM"),
    "GraniteMoeSharedForCausalLM": ("granite_moe", "GraniteMoeForCausalLM"),
    "GraniteMoeHybridForCausalLM": ("granite_moe_hybrid", "GraniteMoeHybridForCausalLM"),
    # LayerNorm decoders, parallel blocks, learned positions
    "GemmaForCausalLM": ("gemma", "GemmaForCausalLM"),
    "CohereForCausalLM": ("cohere", "CohereForCausalLM"),
    "Cohere2ForCausalLM": ("cohere", "Cohere2ForCausalLM"),
    "PhiForCausalLM": ("phi", "PhiForCausalLM"),
    "StableLmForCausalLM": ("stablelm", "StableLmForCausalLM"),
    "NemotronForCausalLM": ("nemotron", "NemotronForCausalLM"),
    "ArceeForCausalLM": ("nemotron", "ArceeForCausalLM"),
    "GPT2LMHeadModel": ("gpt2", "GPT2LMHeadModel"),
    "GPTBigCodeForCausalLM": ("gpt2", "GPTBigCodeForCausalLM"),
    "OPTForCausalLM": ("opt", "OPTForCausalLM"),
    "GPTNeoXForCausalLM": ("gpt_neox", "GPTNeoXForCausalLM"),
    "GPTJForCausalLM": ("gpt_neox", "GPTJForCausalLM"),
    "FalconForCausalLM": ("falcon", "FalconForCausalLM"),
    "Starcoder2ForCausalLM": ("starcoder2", "Starcoder2ForCausalLM"),
    # Llama, Gemma, Granite and MoE variants; GPT-Neo, CodeGen, Persimmon, Apertus, HunYuan
    "OlmoForCausalLM": ("olmo", "OlmoForCausalLM"),
    "HeliumForCausalLM": ("helium", "HeliumForCausalLM"),
    "MinistralForCausalLM": ("ministral", "MinistralForCausalLM"),
    "Ministral3ForCausalLM": ("ministral", "Ministral3ForCausalLM"),
    "GraniteSWAForCausalLM": ("granite_swa", "GraniteSWAForCausalLM"),
    "VaultGemmaForCausalLM": ("vaultgemma", "VaultGemmaForCausalLM"),
    "CwmForCausalLM": ("cwm", "CwmForCausalLM"),
    "HyperCLOVAXForCausalLM": ("hyperclovax", "HyperCLOVAXForCausalLM"),
    "NanoChatForCausalLM": ("nanochat", "NanoChatForCausalLM"),
    "PhimoeForCausalLM": ("phimoe", "PhimoeForCausalLM"),
    "Ernie4_5_MoeForCausalLM": ("ernie4_5_moe", "Ernie4_5_MoeForCausalLM"),
    "Dots1ForCausalLM": ("dots1", "Dots1ForCausalLM"),
    "FlexOlmoForCausalLM": ("flex_olmo", "FlexOlmoForCausalLM"),
    "SolarOpenForCausalLM": ("solar_open", "SolarOpenForCausalLM"),
    "ExaoneMoeForCausalLM": ("exaone_moe", "ExaoneMoeForCausalLM"),
    "HunYuanMoEV1ForCausalLM": ("hunyuan", "HunYuanMoEV1ForCausalLM"),
    "HunYuanDenseV1ForCausalLM": ("hunyuan", "HunYuanDenseV1ForCausalLM"),
    "GPTNeoForCausalLM": ("gpt_neo", "GPTNeoForCausalLM"),
    "CodeGenForCausalLM": ("codegen", "CodeGenForCausalLM"),
    "PersimmonForCausalLM": ("persimmon", "PersimmonForCausalLM"),
    "ApertusForCausalLM": ("apertus", "ApertusForCausalLM"),
    # ALiBi: linear biases on the scores instead of positions
    "BloomForCausalLM": ("bloom", "BloomForCausalLM"),
    "MptForCausalLM": ("mpt", "MptForCausalLM"),
}

# Checkpoints of the decoder without its LM head, as embedding models ship (runner "auto" embeds
# with them): the same modules, whose checkpoint names lack the "model." prefix.
BASE_MODELS = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
    "Gemma2Model": "Gemma2ForCausalLM",
    "Gemma3TextModel": "Gemma3ForCausalLM",
    "Phi3Model": "Phi3ForCausalLM",
    "GraniteModel": "GraniteForCausalLM",
    "Olmo2Model": "Olmo2ForCausalLM",
}

# Classifiers and reward models: the decoder and a score head, for the pooling runner.
SEQUENCE_CLASSIFIERS = {
    f"{name}ForSequenceClassification": f"{name}ForCausalLM"
    for name in ("Llama", "Mistral", "Qwen2", "Qwen3", "Phi3", "Gemma", "GPTNeoX", "StableLm")
    + ("Bloom", "Mpt", "Falcon")
} | {"GPT2ForSequenceClassification": "GPT2LMHeadModel"}

# model_type -> architecture, for a config.json that names none.
MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "glm": "GlmForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "seed_oss": "SeedOssForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
    "granitemoeshared": "GraniteMoeSharedForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "gemma": "GemmaForCausalLM",
    "cohere": "CohereForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "phi": "PhiForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "arcee": "ArceeForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "opt": "OPTForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gptj": "GPTJForCausalLM",
    "falcon": "FalconForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "olmo": "OlmoForCausalLM",
    "helium": "HeliumForCausalLM",
    "ministral": "MinistralForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "granite_swa": "GraniteSWAForCausalLM",
    "vaultgemma": "VaultGemmaForCausalLM",
    "cwm": "CwmForCausalLM",
    "hyperclovax": "HyperCLOVAXForCausalLM",
    "nanochat": "NanoChatForCausalLM",
    "phimoe": "PhimoeForCausalLM",
    "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
    "dots1": "Dots1ForCausalLM",
    "flex_olmo": "FlexOlmoForCausalLM",
    "solar_open": "SolarOpenForCausalLM",
    "exaone_moe": "ExaoneMoeForCausalLM",
    "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM",
    "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
    "gpt_neo": "GPTNeoForCausalLM",
    "codegen": "CodeGenForCausalLM",
    "persimmon": "PersimmonForCausalLM",
    "apertus": "ApertusForCausalLM",
    "bloom": "BloomForCausalLM",
    "mpt": "MptForCausalLM",
}


@functools.cache
def _causal_lm(arch: str) -> type[nn.Module]:
    module, name = MODELS[arch]
    return getattr(importlib.import_module(f"pagedgen.models.{module}"), name)


@functools.cache
def _classifier(arch: str) -> type[nn.Module]:
    return for_sequence_classification(_causal_lm(arch))


def get_model_class(config: PretrainedConfig) -> type[nn.Module]:
    architectures = getattr(config, "architectures", None) or []
    if not architectures and config.model_type in MODEL_TYPES:
        architectures = [MODEL_TYPES[config.model_type]]
    for arch in architectures:
        arch = BASE_MODELS.get(arch, arch)
        if arch in MODELS:
            return _causal_lm(arch)
        if arch in SEQUENCE_CLASSIFIERS:
            return _classifier(SEQUENCE_CLASSIFIERS[arch])
    raise ValueError(
        f"unsupported architecture {architectures or config.model_type!r}; "
        f"pagedgen supports {', '.join([*MODELS, *BASE_MODELS, *SEQUENCE_CLASSIFIERS])}"
    )
