import copy

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.rotary import Rope, RotaryEmbedding, rope_parameters
from pagedgen.model_config import head_dim_of
from pagedgen.models.gpt_oss import GptOssAttention
from pagedgen.models.granite import GraniteForCausalLM


class GraniteSWAAttention(GptOssAttention):
    """Granite's attention (scores times attention_multiplier) with a learned sink per head.
    The reference scales each head's output by sigmoid(logsumexp(scores) - sink), which is
    Z / (Z + exp(sink)): gpt-oss's sink, a logit joining the softmax with a value of zero."""

    def softmax_scale(self, config: PretrainedConfig) -> float:
        return config.attention_multiplier


class GraniteSWAForCausalLM(GraniteForCausalLM):
    """Granite SWA (ibm-granite/granite-swash-2b): Granite 3 with attention sinks, a sliding
    window on the layers layer_types names (all but every fourth by default) and a rope base
    per layer (layer_rope_theta), none where it is 0 (NoPE)."""

    attention_cls = GraniteSWAAttention

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        del self.rotary  # one table per rope base instead
        base = rope_parameters(config)
        thetas = config.layer_rope_theta or [base["rope_theta"]] * len(self.layers)
        bases = sorted({theta for theta in thetas if theta})
        ropes = {}
        for index, theta in enumerate(bases):
            theta_config = copy.copy(config)
            theta_config.rope_parameters = {**base, "rope_theta": theta}
            ropes[f"theta{index}"] = RotaryEmbedding(
                theta_config, head_dim_of(config), max_position
            )
        self.ropes = nn.ModuleDict(ropes)
        self.layer_rope_keys = [f"theta{bases.index(t)}" if t else None for t in thetas]
        for attention, theta in zip(self.attention_layers, thetas, strict=True):
            attention.use_rope = bool(theta)

    def layer_ropes(self, positions: torch.Tensor) -> list[Rope]:
        ropes = {key: rotary(positions) for key, rotary in self.ropes.items()}
        return [ropes[key] if key else None for key in self.layer_rope_keys]  # type: ignore[misc]
