from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.models.deepseek import deepseek_names
from pagedgen.models.dots1 import sigmoid_routed_moe
from pagedgen.models.llama import LlamaForCausalLM


class SolarOpenForCausalLM(LlamaForCausalLM):
    """Solar Open (upstage/Solar-Open-100B): the Llama decoder (q/k/v biased where
    attention_bias, o never) with GLM-4.5's MoE, DeepSeek-V3's sigmoid routing with the
    correction bias and n_shared_experts shared experts, in every layer (no dense ones)."""

    supports_graphs = False  # the expert routing reads token counts on the host

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.attention_bias), False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return sigmoid_routed_moe(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(deepseek_names(weights, len(self.layers)))
