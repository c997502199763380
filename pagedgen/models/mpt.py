"""MPT (mosaicml/mpt-7b, mpt-7b-instruct, mpt-7b-chat, mpt-30b): BLOOM's ALiBi decoder without
biases or the embedding norm, with MPT's slopes."""

import math

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.alibi import mpt_alibi_slopes
from pagedgen.layers.linear import ClippedLinear
from pagedgen.layers.mlp import MLP
from pagedgen.models.bloom import BloomForCausalLM
from pagedgen.models.gpt2 import attention_shape
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer
from pagedgen.models.llama import LayerOptions, LlamaAttention

# MPT's checkpoint names -> ours (Llama's), with or without "transformer."
MPT_RULES = (
    (r"^transformer\.", ""),
    (r"^wte\.", "embed_tokens."),
    (r"^norm_f\.", "norm."),
    (r"^blocks\.(\d+)\.", r"layers.\1."),
    (r"\.norm_1\.", ".input_layernorm."),
    (r"\.norm_2\.", ".post_attention_layernorm."),
    (r"\.attn\.Wqkv\.", ".self_attn.qkv_proj."),
    (r"\.attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.ffn\.", ".mlp."),
)
# What MPT's configs may set that transformers' MptForCausalLM does not compute (it ignores
# them) and we do not either: refused, not run as a different model.
UNSUPPORTED_ATTN_CONFIG = {
    "alibi": (True, "MPT without alibi (learned positions) is not supported"),
    "attn_type": ("multihead_attention", "MPT's multiquery_attention is not supported"),
    "prefix_lm": (False, "MPT's prefix_lm (bidirectional prefix attention) is not supported"),
    "qk_ln": (False, "MPT's qk_ln (q/k LayerNorms) is not supported"),
}
LAYER_NORMS = ("low_precision_layernorm", "layernorm")


class MptDecoderLayer(LayerNormDecoderLayer):
    norm_bias = False  # MPT's LayerNorms have none (no_bias)


class MptForCausalLM(BloomForCausalLM):
    """MPT: BLOOM's decoder (pre-norm, ALiBi, no rotary embedding, the LM head tied to wte)
    with no bias anywhere, LayerNorms included (no_bias), no embedding LayerNorm, MPT's ALiBi
    slopes (mpt_alibi_slopes, alibi_bias_max 8), q/k/v one tensor (Wqkv) already
    [q | k | v], clamped to +-clip_qkv where set, scores scaled by attn_config.softmax_scale
    where set (else head_dim ** -0.5), and an exact-GELU MLP of expansion_ratio x d_model
    (transformers' of 4 x: the same for every released MPT). Checkpoint names are renamed to
    Llama's as they load.
    """

    rules = MPT_RULES
    norm_bias = False
    per_head_qkv = False  # Wqkv's rows are [q | k | v] already

    def check_config(self, config: PretrainedConfig) -> None:
        attention_shape(config, config.num_attention_heads)
        attn_config = config.attn_config
        for name, (supported, message) in UNSUPPORTED_ATTN_CONFIG.items():
            if getattr(attn_config, name) != supported:
                raise ValueError(message)
        if attn_config.alibi_bias_max != 8:  # transformers builds its slopes with 8 whatever
            raise ValueError("MPT's alibi_bias_max other than 8 is not supported")
        if not config.no_bias:
            raise ValueError("MPT with biases (no_bias False) is not supported")
        if config.logit_scale is not None:
            raise ValueError("MPT's logit_scale is not supported")
        if config.norm_type not in LAYER_NORMS:
            raise ValueError(f"MPT's norm_type {config.norm_type!r} is not supported")
        ffn_type = (getattr(config, "ffn_config", None) or {}).get("ffn_type", "mptmlp")
        if ffn_type != "mptmlp":
            raise ValueError(f"MPT's ffn_type {ffn_type!r} is not supported")

    def make_embed_norm(self, config: PretrainedConfig) -> nn.Module | None:
        return None

    def alibi_slopes(self, config: PretrainedConfig) -> torch.Tensor:
        return mpt_alibi_slopes(config.num_attention_heads)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        attn_config, hidden = config.attn_config, config.hidden_size
        scale = attn_config.softmax_scale
        if scale is None:
            scale = 1 / math.sqrt(hidden / config.num_attention_heads)
        layer = LayerOptions(scale=scale, alibi_slopes=self.alibi_slopes(config))
        attention = LlamaAttention(config, backend, qkv_bias=False, o_bias=False, layer=layer)
        if attn_config.clip_qkv:
            attention.qkv_proj = ClippedLinear.of(attention.qkv_proj, attn_config.clip_qkv)
        mlp = MLP(hidden, int(config.expansion_ratio * hidden), "gelu", bias=False)
        return MptDecoderLayer(config, attention, mlp)
