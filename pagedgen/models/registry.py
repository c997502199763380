from torch import nn
from transformers import PretrainedConfig

from pagedgen.models.classifier import for_sequence_classification
from pagedgen.models.deepseek import DeepseekV2ForCausalLM
from pagedgen.models.exaone4 import Exaone4ForCausalLM
from pagedgen.models.gemma2 import Gemma2ForCausalLM
from pagedgen.models.gemma3 import Gemma3ForCausalLM
from pagedgen.models.glm import Ernie4_5ForCausalLM, Glm4ForCausalLM, GlmForCausalLM
from pagedgen.models.glm4_moe import Glm4MoeForCausalLM
from pagedgen.models.gpt_oss import GptOssForCausalLM
from pagedgen.models.granite import GraniteForCausalLM
from pagedgen.models.granite_moe import GraniteMoeForCausalLM
from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.minimax_m2 import MiniMaxM2ForCausalLM
from pagedgen.models.moe import (
    MixtralForCausalLM,
    OlmoeForCausalLM,
    Qwen2MoeForCausalLM,
    Qwen3MoeForCausalLM,
)
from pagedgen.models.olmo2 import Olmo2ForCausalLM, Olmo3ForCausalLM
from pagedgen.models.phi3 import Phi3ForCausalLM
from pagedgen.models.qwen3 import Qwen3ForCausalLM
from pagedgen.models.smollm3 import SmolLM3ForCausalLM

MODELS: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV2ForCausalLM,
    "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "MiniMaxM2ForCausalLM": MiniMaxM2ForCausalLM,
    "GlmForCausalLM": GlmForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "Olmo3ForCausalLM": Olmo3ForCausalLM,
    "SeedOssForCausalLM": LlamaForCausalLM,
    "Exaone4ForCausalLM": Exaone4ForCausalLM,
    "GraniteMoeForCausalLM": GraniteMoeForCausalLM,
    "GraniteMoeSharedForCausalLM": GraniteMoeForCausalLM,
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
    f"{name}ForSequenceClassification": for_sequence_classification(MODELS[f"{name}ForCausalLM"])
    for name in ("Llama", "Mistral", "Qwen2", "Qwen3", "Phi3")
}

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
}


def get_model_class(config: PretrainedConfig) -> type[nn.Module]:
    architectures = getattr(config, "architectures", None) or []
    if not architectures and config.model_type in MODEL_TYPES:
        architectures = [MODEL_TYPES[config.model_type]]
    for arch in architectures:
        arch = BASE_MODELS.get(arch, arch)
        if arch in MODELS or arch in SEQUENCE_CLASSIFIERS:
            return MODELS.get(arch) or SEQUENCE_CLASSIFIERS[arch]
    raise ValueError(
        f"unsupported architecture {architectures or config.model_type!r}; "
        f"pagedgen supports {', '.join([*MODELS, *BASE_MODELS, *SEQUENCE_CLASSIFIERS])}"
    )
