"""BLOOM (bigscience/bloom-560m to bloom-176b, bloomz): ALiBi instead of position embeddings, a
LayerNorm on the embeddings, and, in some checkpoints, residuals taken after the norms."""

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.alibi import bloom_alibi_slopes
from pagedgen.layers.linear import Linear
from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import LayerNorm, add_norm
from pagedgen.layers.rotary import Rope
from pagedgen.models.gpt2 import attention_shape, empty_embedding
from pagedgen.models.gpt_neox import qkv_head_by_head
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer, norm_eps
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM
from pagedgen.models.names import renamed

# BLOOM's checkpoint names -> ours (Llama's), with or without "transformer."
BLOOM_RULES = (
    (r"^transformer\.", ""),
    (r"^word_embeddings\.", "embed_tokens."),
    (r"^word_embeddings_layernorm\.", "embed_norm."),
    (r"^ln_f\.", "norm."),
    (r"^h\.(\d+)\.", r"layers.\1."),
    (r"\.self_attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.self_attention\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
    (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
)


class BloomPostNormResidualLayer(LayerNormDecoderLayer):
    """BLOOM's layer with apply_residual_connection_post_layernorm: each sublayer's output is
    added to its input's norm, not to its input, x = ln1(x) + attn(ln1(x)), then
    ln2(x) + mlp(ln2(x))."""

    def forward(
        self,
        rope: Rope | None,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed = add_norm(self.input_layernorm, hidden, residual)[0]
        attention = self.self_attn(rope, normed, metadata)
        normed = self.post_attention_layernorm(attention, normed)[0]
        return self.mlp(normed), normed


class BloomForCausalLM(LlamaForCausalLM):
    """BLOOM: the Llama decoder with biased LayerNorms (and one more, word_embeddings_layernorm,
    on the token embeddings), no rotary embedding but ALiBi (bloom_alibi_slopes), q/k/v one
    biased tensor laid out head by head ([heads, 3, head_dim] rows, as GPT-NeoX's), reordered
    into our [q | k | v] rows as it loads, a biased output projection (dense), an ungated
    tanh-GELU MLP of 4 x hidden_size (dense_h_to_4h, dense_4h_to_h), and the LM head tied to the
    embeddings. With apply_residual_connection_post_layernorm, BloomPostNormResidualLayer.
    pretraining_tp's slow_but_exact sums the output projections' slices: the same product.
    Checkpoint names are renamed to Llama's as they load, with or without "transformer."
    (bloom-560m's hub checkpoint has none).
    """

    rules = BLOOM_RULES
    norm_bias = True
    per_head_qkv = True  # query_key_value's rows head by head

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        nn.Module.__init__(self)  # Llama's would build a rotary table and SiLU MLPs
        self.check_config(config)
        self.config = config
        self.embed_tokens = empty_embedding(config.vocab_size, config.hidden_size)
        self.embed_norm = self.make_embed_norm(config)
        self.layers = nn.ModuleList(
            self.make_layer(config, backend, i) for i in range(config.num_hidden_layers)
        )
        self.norm = LayerNorm(config.hidden_size, norm_eps(config), bias=self.norm_bias)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    def check_config(self, config: PretrainedConfig) -> None:
        attention_shape(config, config.num_attention_heads)

    def make_embed_norm(self, config: PretrainedConfig) -> nn.Module | None:
        return LayerNorm(config.hidden_size, norm_eps(config))

    def alibi_slopes(self, config: PretrainedConfig) -> torch.Tensor:
        return bloom_alibi_slopes(config.num_attention_heads)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        layer = LayerOptions(alibi_slopes=self.alibi_slopes(config))
        attention = LlamaAttention(config, backend, qkv_bias=True, o_bias=True, layer=layer)
        hidden = config.hidden_size
        mlp = MLP(hidden, 4 * hidden, "gelu_pytorch_tanh", bias=True)  # bloom_gelu: tanh GELU
        if config.apply_residual_connection_post_layernorm:
            return BloomPostNormResidualLayer(config, attention, mlp)
        return LayerNormDecoderLayer(config, attention, mlp)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden, residual = self.embed(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(None, hidden, residual, metadata)  # no rope
        return self.norm(hidden, residual)[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        return hidden if self.embed_norm is None else self.embed_norm(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        weights = renamed(weights, self.rules)
        if self.per_head_qkv:
            weights = qkv_head_by_head(weights, self.config)
        super().load_weights(weights)
