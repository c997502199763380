from torch import nn
from transformers import PretrainedConfig

from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.qwen3 import Qwen3ForCausalLM

MODELS: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_class(config: PretrainedConfig) -> type[nn.Module]:
    architectures = getattr(config, "architectures", None) or []
    if not architectures and config.model_type in ("llama", "mistral", "qwen2", "qwen3"):
        architectures = [f"{config.model_type.capitalize()}ForCausalLM"]
    for arch in architectures:
        if arch in MODELS:
            return MODELS[arch]
    raise ValueError(
        f"unsupported architecture {architectures or config.model_type!r}; "
        f"pagedgen supports {', '.join(MODELS)}"
    )
