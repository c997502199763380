"""GPT-Neo (EleutherAI's gpt-neo-125M, 1.3B, 2.7B): GPT-2's learned positions, with global and
local (sliding-window) attention layers."""

from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.mlp import MLP
from pagedgen.model_config import layer_sliding_windows
from pagedgen.models.gpt2 import GPT2_RULES, AbsoluteAttention, GPT2LMHeadModel, attention_shape
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer
from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.names import renamed

# GPT-2's names, and GPT-Neo's attention: h.N.attn.attention.{q,k,v,out}_proj
NEO_RULES = (
    *GPT2_RULES,
    (r"\.attn\.attention\.out_proj\.", ".self_attn.o_proj."),
    (r"\.attn\.attention\.", ".self_attn."),
)
# the causal (or windowed) mask and its fill value older checkpoints saved
NEO_BUFFERS = r"\.attn\.attention\.(masked_)?bias$"


class GPTNeoForCausalLM(GPT2LMHeadModel):
    """GPT-Neo: GPT-2 (learned absolute positions wpe, biased LayerNorms, an ungated biased MLP
    c_fc / c_proj with activation_function, gelu_new) whose layers alternate, as
    attention_types says, between global attention and local attention over the last
    window_size tokens (the query's own included); the scores are not scaled (no
    1/sqrt(head_dim)); q, k and v are separate unbiased nn.Linear projections
    (attn.attention.q_proj, ...) and out_proj is biased; the LM head is unbiased, tied to wte
    unless the checkpoint has its own."""

    conv1d = False

    @staticmethod
    def check_config(config: PretrainedConfig) -> None:
        layer_sliding_windows(config)  # refuses attention types other than global and local

    @staticmethod
    def attention_scale(config: PretrainedConfig, index: int) -> float:
        return 1.0

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        shape = attention_shape(config, self.num_kv_heads(config))
        layer = replace(
            self.layer_options(config, index), scale=self.attention_scale(config, index)
        )
        attention = AbsoluteAttention(shape, backend, qkv_bias=False, o_bias=True, layer=layer)
        inner = config.intermediate_size or 4 * config.hidden_size
        mlp = MLP(config.hidden_size, inner, config.activation_function, bias=True)
        return LayerNormDecoderLayer(config, attention, mlp)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        LlamaForCausalLM.load_weights(self, renamed(weights, NEO_RULES, skip=NEO_BUFFERS))
