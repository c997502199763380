"""OPT (facebook/opt-125m to opt-66b): learned absolute positions (offset by 2), pre-norm or, in
opt-350m, post-norm layers, and an embedding width of its own projected in and out."""

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.linear import Linear
from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import LayerNorm
from pagedgen.layers.rotary import Rope
from pagedgen.models.gpt2 import AbsoluteAttention, attention_shape, empty_embedding
from pagedgen.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from pagedgen.models.names import renamed

# OPT's checkpoint names -> ours (Llama's), with or without "model."
OPT_RULES = (
    (r"^(model\.)?decoder\.", ""),
    (r"^final_layer_norm\.", "norm."),  # the decoder's; the layers' are below
    (r"\.self_attn_layer_norm\.", ".input_layernorm."),
    (r"\.final_layer_norm\.", ".post_attention_layernorm."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.fc1\.", ".mlp.up_proj."),
    (r"\.fc2\.", ".mlp.down_proj."),
)
OPT_POSITION_OFFSET = 2  # position p reads row p + 2 (fairseq kept the first rows for padding)
OPT_NORM_EPS = 1e-5  # nn.LayerNorm's default: OPT's config names no epsilon


def opt_norm(config: PretrainedConfig) -> LayerNorm:
    return LayerNorm(config.hidden_size, OPT_NORM_EPS)


class OPTDecoderLayer(LlamaDecoderLayer):
    """The pre-norm Llama layer with OPT's LayerNorms: input_layernorm is OPT's
    self_attn_layer_norm, post_attention_layernorm the layer's final_layer_norm."""

    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return opt_norm(config)


class OPTPostNormDecoderLayer(OPTDecoderLayer):
    """opt-350m's layer (do_layer_norm_before False): each sublayer's output is added to its
    input and the sum normed, x = norm(x + f(x)). The stream leaves each layer normed, so no
    residual passes on to the next."""

    def forward(
        self,
        rope: Rope,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, None]:
        if residual is not None:
            hidden = hidden + residual
        hidden = self.input_layernorm(self.self_attn(rope, hidden, metadata), hidden)[0]
        return self.post_attention_layernorm(self.mlp(hidden), hidden)[0], None


class OPTForCausalLM(LlamaForCausalLM):
    """OPT: the Llama decoder with a learned position embedding (read at position + 2) added to
    the token one instead of RoPE, biased LayerNorms, q/k/v and out projections and a ReLU MLP
    (fc1, fc2) biased where enable_bias, and the LM head tied to the embeddings. opt-350m's
    variants: post-norm layers (do_layer_norm_before False, and then no final norm, as with
    _remove_final_layer_norm) and embeddings of word_embed_proj_dim, projected in to hidden_size
    (project_in) and back out before the LM head (project_out).
    Checkpoint names are renamed to Llama's as they load, with or without "model.".
    """

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        nn.Module.__init__(self)  # Llama's would build a rotary table and SiLU MLPs
        if not getattr(config, "layer_norm_elementwise_affine", True):
            raise ValueError("OPT with layer_norm_elementwise_affine False is not supported")
        self.config = config
        hidden, embed_dim = config.hidden_size, config.word_embed_proj_dim
        self.embed_tokens = empty_embedding(config.vocab_size, embed_dim)
        self.embed_positions = empty_embedding(
            config.max_position_embeddings + OPT_POSITION_OFFSET, hidden
        )
        projected = embed_dim != hidden
        self.project_in = Linear(embed_dim, hidden) if projected else None
        self.project_out = Linear(hidden, embed_dim) if projected else None
        self.layers = nn.ModuleList(
            self.make_layer(config, backend, i) for i in range(config.num_hidden_layers)
        )
        final_norm = config.do_layer_norm_before and not config._remove_final_layer_norm
        self.norm = opt_norm(config) if final_norm else None
        self.lm_head = Linear(embed_dim, config.vocab_size)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        bias = config.enable_bias
        shape = attention_shape(config, config.num_attention_heads)
        layer = self.layer_options(config, index)
        attention = AbsoluteAttention(shape, backend, qkv_bias=bias, o_bias=bias, layer=layer)
        mlp = MLP(config.hidden_size, config.ffn_dim, config.activation_function, bias=bias)
        layer_cls = OPTDecoderLayer if config.do_layer_norm_before else OPTPostNormDecoderLayer
        return layer_cls(config, attention, mlp)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed(input_ids)
        if self.project_in is not None:
            hidden = self.project_in(hidden)
        hidden = hidden + self.embed_positions(positions + OPT_POSITION_OFFSET)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(None, hidden, residual, metadata)  # no rope
        if self.norm is not None:
            hidden = self.norm(hidden, residual)[0]
        elif residual is not None:
            hidden = hidden + residual
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(renamed(weights, OPT_RULES))
