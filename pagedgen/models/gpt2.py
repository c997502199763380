"""GPT-2 and GPT-BigCode (SantaCoder, StarCoder): learned absolute position embeddings added to
the token embeddings, on a pre-norm LayerNorm decoder."""

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.linear import Linear
from pagedgen.layers.mlp import MLP
from pagedgen.model_config import num_kv_heads_of
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer
from pagedgen.models.llama import LlamaAttention, LlamaForCausalLM
from pagedgen.models.names import renamed

# GPT-2 / GPT-BigCode checkpoint names -> ours (Llama's), with or without "transformer."
GPT2_RULES = (
    (r"^transformer\.", ""),
    (r"^wte\.", "embed_tokens."),
    (r"^wpe\.", "embed_positions."),
    (r"^ln_f\.", "norm."),
    (r"^h\.(\d+)\.", r"layers.\1."),
    (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."),
    (r"\.attn\.c_attn\.", ".self_attn.qkv_proj."),
    (r"\.attn\.c_proj\.", ".self_attn.o_proj."),
    (r"\.mlp\.c_fc\.", ".mlp.up_proj."),
    (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
)
# The causal-mask buffers older checkpoints saved: h.N.attn.bias / masked_bias, BigCode's bias.
GPT2_BUFFERS = r"(^|\.)attn\.(masked_)?bias$|^(transformer\.)?bias$"
CONV1D_WEIGHT = re.compile(r"\.(c_attn|c_proj|c_fc)\.weight$")


def empty_embedding(num_embeddings: int, dim: int) -> nn.Embedding:
    """An embedding table to be loaded from the checkpoint (no random init)."""
    embedding = nn.Embedding(num_embeddings, dim, _weight=torch.empty(num_embeddings, dim))
    embedding.weight.requires_grad_(False)
    return embedding


def attention_shape(config: PretrainedConfig, num_kv_heads: int) -> PretrainedConfig:
    """config, refused unless its heads divide hidden_size and its K/V heads (num_kv_heads_of,
    which sizes the cache: GPT-2's and OPT's configs name none; GPT-BigCode's follows
    multi_query) are the num_kv_heads the architecture attends with."""
    if config.hidden_size % config.num_attention_heads:
        raise ValueError("hidden_size must be a multiple of num_attention_heads")
    if (cached := num_kv_heads_of(config)) != num_kv_heads:
        raise ValueError(
            f"the config's num_key_value_heads ({cached}) is not the {num_kv_heads} kv heads "
            f"{config.model_type} attends with"
        )
    return config


class AbsoluteAttention(LlamaAttention):
    """Llama attention without the rotary embedding: positions entered with the embeddings."""

    use_rope = False


class GPT2LMHeadModel(LlamaForCausalLM):
    """GPT-2 (gpt2 to gpt2-xl, distilgpt2): the Llama decoder with a learned position embedding
    (wpe) added to the token one instead of RoPE, biased LayerNorms (ln_1, ln_2, ln_f), fused and
    biased q/k/v (c_attn) and out (c_proj) projections, an ungated gelu_new MLP (c_fc, c_proj),
    and the LM head tied to the embeddings. Conv1D stores weights [in, out]: they are transposed
    as they load. scale_attn_by_inverse_layer_idx divides layer i's scores by i + 1;
    reorder_and_upcast_attn (float32 scores in training) computes the same and is accepted.
    Checkpoint names are renamed to Llama's as they load, with or without "transformer.".
    """

    conv1d = True  # GPT-2's Conv1D weights; GPT-BigCode's are nn.Linear's

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        nn.Module.__init__(self)  # Llama's would build a rotary table and SiLU MLPs
        self.check_config(config)
        self.config = config
        self.embed_tokens = empty_embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = empty_embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(
            self.make_layer(config, backend, i) for i in range(config.num_hidden_layers)
        )
        self.norm = LayerNormDecoderLayer.make_norm(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    @staticmethod
    def check_config(config: PretrainedConfig) -> None:
        if getattr(config, "add_cross_attention", False):
            raise ValueError(f"{config.model_type} with add_cross_attention is not supported")

    @staticmethod
    def num_kv_heads(config: PretrainedConfig) -> int:
        return config.num_attention_heads

    @staticmethod
    def attention_scale(config: PretrainedConfig, index: int) -> float:
        """head_dim ** -0.5 unless scale_attn_weights is False; GPT-2's
        scale_attn_by_inverse_layer_idx divides layer index's by index + 1."""
        scale = (config.hidden_size // config.num_attention_heads) ** -0.5
        scale = scale if config.scale_attn_weights else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(index + 1)
        return scale

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        shape = attention_shape(config, self.num_kv_heads(config))
        layer = replace(
            self.layer_options(config, index), scale=self.attention_scale(config, index)
        )
        attention = AbsoluteAttention(shape, backend, qkv_bias=True, o_bias=True, layer=layer)
        inner = config.n_inner if config.n_inner is not None else 4 * config.hidden_size
        mlp = MLP(config.hidden_size, inner, config.activation_function, bias=True)
        return LayerNormDecoderLayer(config, attention, mlp)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden, residual = self.embed(input_ids) + self.embed_positions(positions), None
        for layer in self.layers:
            hidden, residual = layer(None, hidden, residual, metadata)  # no rope
        return self.norm(hidden, residual)[0]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(renamed(self.as_linear(weights), GPT2_RULES, skip=GPT2_BUFFERS))

    def as_linear(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's projections in nn.Linear's layout: [out, in], q/k/v rows in turn."""
        for name, tensor in weights:
            if self.conv1d and CONV1D_WEIGHT.search(name):
                tensor = tensor.t()
            yield name, tensor


class GPTBigCodeForCausalLM(GPT2LMHeadModel):
    """GPT-BigCode (SantaCoder, StarCoder, StarCoderBase, tiny_starcoder): GPT-2 with nn.Linear
    weights (no transpose), gelu_pytorch_tanh, and, with multi_query (the default), one kv head:
    c_attn's rows are q (hidden_size), k (head_dim), v (head_dim). Without multi_query, c_attn's
    rows are q, k, v per head in turn, reordered as they load into q, k, v for all heads."""

    conv1d = False

    @staticmethod
    def num_kv_heads(config: PretrainedConfig) -> int:
        return 1 if config.multi_query else config.num_attention_heads

    def as_linear(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        num_heads = self.config.num_attention_heads
        for name, tensor in super().as_linear(weights):
            if not self.config.multi_query and re.search(r"\.attn\.c_attn\.", name):
                # [heads, (q, k, v), head_dim, ...] -> [(q, k, v), heads, head_dim, ...]
                tensor = tensor.unflatten(0, (num_heads, 3, -1)).transpose(0, 1).flatten(0, 2)
            yield name, tensor
