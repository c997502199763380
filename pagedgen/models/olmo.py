import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.linear import ClippedLinear
from pagedgen.layers.norm import ResidualNorm
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

OLMO_LAYER_NORM_EPS = 1e-5  # fixed in the reference; the config names none


class OlmoLayerNorm(ResidualNorm):
    """LayerNorm with no weight and no bias, computed in float32, with RMSNorm's interface."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.shape = (hidden_size,)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(x.float(), self.shape, None, None, OLMO_LAYER_NORM_EPS)
        return normed.to(x.dtype)


class OlmoAttention(LlamaAttention):
    """Llama attention whose q, k and v are clamped to [-clip_qkv, clip_qkv] where the config
    sets it, before the rotary embedding."""

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        if (clip := getattr(config, "clip_qkv", None)) is not None:
            self.qkv_proj = ClippedLinear.of(self.qkv_proj, clip)


class OlmoDecoderLayer(LlamaDecoderLayer):
    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return OlmoLayerNorm(config.hidden_size)


class OlmoForCausalLM(LlamaForCausalLM):
    """OLMo (1) and OLMo 1.7 (allenai/OLMo-1B-hf, OLMo-7B-0424-hf): the Llama decoder with
    non-parametric LayerNorms (no weight, no bias, eps 1e-5) for its RMSNorms, the final one
    too, and q/k/v clamped at clip_qkv (OLMo 1.7). attention_bias biases all four projections."""

    attention_cls = OlmoAttention
    decoder_layer_cls = OlmoDecoderLayer
