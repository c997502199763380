from typing import NamedTuple

import torch
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.rotary import Rope, rope_parameters
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM


class MinistralForCausalLM(LlamaForCausalLM):
    """Ministral (Ministral-8B-Instruct-2410): Mistral with a sliding window on the layers
    layer_types names rather than on all of them; the Llama model reads both from the config."""


class QueryScaledRope(NamedTuple):
    """A step's rotary rows for the keys, and for the queries the same rows times each token's
    Llama 4 attention scale (rotation is linear: scaling before it or after, alike)."""

    key: Rope
    query: Rope


class Ministral3Attention(LlamaAttention):
    """Llama attention whose queries are scaled by 1 + beta * log(1 + floor(position /
    original_max_position_embeddings)) after the rotary embedding, both applied at once."""

    has_qk_norm = True  # normalize_qk applies the rotary embeddings, use_rope turns off theirs
    use_rope = False

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        self.ropes: QueryScaledRope | None = None  # the step's, set by forward

    def forward(
        self, rope: QueryScaledRope, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        self.ropes = rope
        return super().forward(rope.key, hidden, metadata)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.ropes is not None
        return self.ropes.query.apply(q), self.ropes.key.apply(k)


class Ministral3ForCausalLM(LlamaForCausalLM):
    """Ministral 3 (Ministral-3-3B/8B/14B, the text decoder of Mistral3ForConditionalGeneration):
    Mistral (no biases, YaRN rope, sliding_window on every layer if set) with the queries of
    each token scaled by Llama 4's position-dependent attention scale (rope_parameters'
    llama_4_scaling_beta and original_max_position_embeddings)."""

    attention_cls = Ministral3Attention

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        params = rope_parameters(config)
        self.beta = params.get("llama_4_scaling_beta")
        self.scale_period = params.get("original_max_position_embeddings")
        if self.beta is None or self.scale_period is None:
            raise ValueError(
                "ministral3 needs rope_parameters' llama_4_scaling_beta and "
                "original_max_position_embeddings"
            )

    def layer_ropes(self, positions: torch.Tensor) -> list[QueryScaledRope]:
        rope = self.rotary(positions)
        periods = torch.floor(positions.float() / self.scale_period)
        scale = (1 + self.beta * torch.log(1 + periods))[:, None, None]
        ropes = QueryScaledRope(rope, Rope(rope.cos * scale, rope.sin * scale))
        return [ropes] * len(self.layers)
