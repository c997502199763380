from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.norm import LayerNorm
from pagedgen.layers.rotary import pairs_to_halves, reorder_heads
from pagedgen.model_config import head_dim_of
from pagedgen.models.layernorm_decoder import ParallelDecoderLayer
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM, LlamaMLP


def cohere_norm(shape: int | tuple[int, int], config: PretrainedConfig) -> LayerNorm:
    """Cohere's LayerNorm: no bias, computed in float32 and rounded once."""
    return LayerNorm(shape, config.layer_norm_eps, bias=False, upcast=True)


class CohereAttention(LlamaAttention):
    """Llama attention with, where use_qk_norm (Command R+), a LayerNorm over each head of q and
    k, a weight per head, before the rotary embedding."""

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        self.has_qk_norm = bool(getattr(config, "use_qk_norm", False))
        if self.has_qk_norm:
            self.q_norm = cohere_norm((self.num_heads, self.head_dim), config)
            self.k_norm = cohere_norm((self.num_kv_heads, self.head_dim), config)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.has_qk_norm:
            return q, k
        return self.q_norm(q), self.k_norm(k)


class CohereForCausalLM(LlamaForCausalLM):
    """Command R, Command R+, Aya 23 / Expanse (cohere): one norm feeds attention and the MLP side
    by side (ParallelDecoderLayer), LayerNorms without bias, rotary embeddings in interleaved
    pairs, whose q and k rows (and q/k norm weights) are reordered as they load so that the Llama
    rotary embedding applies, and logits scaled by logit_scale; the LM head is tied to the
    embeddings."""

    attention_cls = CohereAttention

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        biases, layer = self.attention_biases(config), self.layer_options(config, index)
        attention = self.attention_cls(config, backend, *biases, layer)
        norm = cohere_norm(config.hidden_size, config)
        return ParallelDecoderLayer(attention, LlamaMLP(config), norm)

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        self.norm = cohere_norm(config.hidden_size, config)
        self.logit_scale = config.logit_scale

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.attention_bias), bool(config.attention_bias)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) * self.logit_scale

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._pairs_to_halves(weights))

    def _pairs_to_halves(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        head_dim = head_dim_of(self.config)
        order = pairs_to_halves(head_dim, 0, 2 * self.rotary.cos.shape[-1])
        for name, tensor in weights:
            module = name.split(".")[-2]
            if module in ("q_proj", "k_proj"):
                tensor = reorder_heads(tensor, order)
            elif module in ("q_norm", "k_norm"):  # [heads, head_dim]
                tensor = tensor[:, order]
            yield name, tensor


class Cohere2ForCausalLM(CohereForCausalLM):
    """Command R7B, Command A (cohere2): Cohere with sliding-window attention on the layers
    layer_types names (three of four) and no positional encoding on the others (NoPE)."""

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        for attention, kind in zip(self.attention_layers, config.layer_types, strict=True):
            attention.use_rope = kind == "sliding_attention"
