"""Persimmon (Adept's persimmon-8b-base and -chat, and Fuyu-8B's language model)."""

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.mlp import MLP
from pagedgen.model_config import head_dim_of
from pagedgen.models.gpt_neox import check_all_kv_heads, qkv_head_by_head
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer
from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.names import renamed
from pagedgen.models.phi import PhiAttention

# checkpoint names -> ours (the "model." prefix is dropped later)
PERSIMMON_RENAMES = (
    (r"\.self_attn\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
    (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
    (r"^model\.final_layernorm\.", "model.norm."),
)


class PersimmonForCausalLM(LlamaForCausalLM):
    """Persimmon: the Llama layer order (norm, attention, add, norm, MLP, add) with biased
    LayerNorms (the final one final_layernorm); q/k/v one biased tensor (query_key_value) laid
    out head by head ([heads, 3, head_dim] rows, as GPT-NeoX's), reordered into our
    [q | k | v] rows as it loads; where qk_layernorm (the default), a biased LayerNorm over each
    head of q and of k, one weight shared by all heads, before the rotary embedding, which
    turns the first partial_rotary_factor (0.5) of each head (rotate_half); a biased output
    projection (dense); an ungated biased MLP (dense_h_to_4h, dense_4h_to_h) with hidden_act
    (relu2); an unbiased lm_head. Every head has its own K and V."""

    attention_cls = PhiAttention  # the optional q/k LayerNorms shared by the heads
    decoder_layer_cls = LayerNormDecoderLayer

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        heads = config.num_attention_heads
        if config.hidden_size % heads or head_dim_of(config) != config.hidden_size // heads:
            raise ValueError("Persimmon's head_dim must be hidden_size / num_attention_heads")
        super().__init__(check_all_kv_heads(config), backend, max_position)

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return True, True

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return MLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(qkv_head_by_head(renamed(weights, PERSIMMON_RENAMES), self.config))
