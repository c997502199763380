from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.model_config import layer_sliding_windows
from pagedgen.models.deepseek import deepseek_names
from pagedgen.models.dots1 import sigmoid_routed_moe
from pagedgen.models.llama import LlamaForCausalLM, LlamaMLP
from pagedgen.models.qwen3 import Qwen3Attention


class ExaoneMoeForCausalLM(LlamaForCausalLM):
    """K-EXAONE (LGAI-EXAONE/K-EXAONE-236B-A23B): EXAONE 4.0's attention (per-head q/k norms;
    where the config has a sliding window, the layers layer_types names attend through it and
    the full-attention ones take no rotary embedding) in pre-norm Llama layers, whose MLPs are,
    where mlp_layer_types says "sparse", DeepSeek-V3's MoE (sigmoid routing with the correction
    bias, num_shared_experts shared experts). The multi-token-prediction weights (mtp.*) are
    skipped, as transformers skips them."""

    attention_cls = Qwen3Attention
    supports_graphs = False  # the expert routing reads token counts on the host

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        if getattr(config, "sliding_window", None) is not None:
            windows = layer_sliding_windows(config)
            for attention, window in zip(self.attention_layers, windows, strict=True):
                attention.use_rope = window is not None

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return False, False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        if config.mlp_layer_types[index] != "sparse":
            return LlamaMLP(config)
        return sigmoid_routed_moe(
            config, n_routed_experts=config.num_experts, n_shared_experts=config.num_shared_experts
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        weights = (w for w in weights if not w[0].removeprefix("model.").startswith("mtp"))
        super().load_weights(deepseek_names(weights, len(self.layers)))
