import copy
from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.models.deepseek import DeepseekMoE, deepseek_names
from pagedgen.models.llama import LlamaMLP
from pagedgen.models.qwen3 import Qwen3ForCausalLM


def sigmoid_routed_moe(config: PretrainedConfig, **names: object) -> DeepseekMoE:
    """DeepSeek-V3's MoE (sigmoid routing with the correction bias, in groups, shared experts)
    for a model whose transformers class routes so whatever its config says: the config seen
    through scoring_func "sigmoid" and the DeepSeek names given (n_routed_experts=...) for its
    own."""
    moe_config = copy.copy(config)  # shallow: the model's config stays as it was
    for name, value in dict(scoring_func="sigmoid", **names).items():
        setattr(moe_config, name, value)
    return DeepseekMoE(moe_config)


class Dots1ForCausalLM(Qwen3ForCausalLM):
    """dots.llm1 (rednote-hilab): the Qwen3 decoder (per-head q/k norms, every projection biased
    where attention_bias; a sliding window on the layers layer_types names) with DeepSeek-V3's
    MoE (sigmoid routing with the correction bias, n_shared_experts shared experts) in every
    layer from first_k_dense_replace on; transformers' Dots1 routes by sigmoid whatever
    scoring_func its config names."""

    supports_graphs = False  # the expert routing reads token counts on the host

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        if index < config.first_k_dense_replace:
            return LlamaMLP(config)
        return sigmoid_routed_moe(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(deepseek_names(weights, len(self.layers)))
