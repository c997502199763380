from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionMetadata
from pagedgen.layers.norm import RMSNorm, add_norm
from pagedgen.layers.rotary import Rope, pairs_to_halves, reorder_heads
from pagedgen.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP


class Glm4DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with a second norm on each sublayer's output, before it joins the
    residual stream (post_self_attn_layernorm, post_mlp_layernorm)."""

    def __init__(self, config: PretrainedConfig, attention: nn.Module, mlp: nn.Module) -> None:
        super().__init__(config, attention, mlp)
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        rope: Rope,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = add_norm(self.input_layernorm, hidden, residual)
        hidden = self.post_self_attn_layernorm(self.self_attn(rope, hidden, metadata))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.post_mlp_layernorm(self.mlp(hidden)), residual


class GlmForCausalLM(LlamaForCausalLM):
    """GLM-4 (glm: GLM-4-9B-chat-hf): the Llama decoder with q/k/v biased (o not), the MLP's
    gate and up one checkpoint tensor, and rotary embeddings on the first half of each head
    (partial_rotary_factor 0.5) in interleaved pairs, whose q and k rows are reordered as they
    load (rotary.pairs_to_halves) so that the Llama rotary embedding applies."""

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.attention_bias), False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._pairs_to_halves(weights))

    def _pairs_to_halves(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        order = pairs_to_halves(self.layers[0].self_attn.head_dim, 0, 2 * self.rotary.cos.shape[-1])
        for name, tensor in weights:
            if name.split(".")[-2] in ("q_proj", "k_proj"):
                tensor = reorder_heads(tensor, order)
            yield name, tensor


class Ernie4_5ForCausalLM(GlmForCausalLM):
    """ERNIE 4.5 (dense: ERNIE-4.5-0.3B): GLM-4's interleaved rotary pairs over the whole head,
    and every projection, attention's and the MLP's, biased where use_bias."""

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.use_bias), bool(config.use_bias)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return LlamaMLP(config, bias=bool(config.use_bias))


class Glm4ForCausalLM(GlmForCausalLM):
    """GLM-4-0414 and GLM-Z1 (glm4): GLM-4 with each sublayer's output normed again."""

    decoder_layer_cls = Glm4DecoderLayer
