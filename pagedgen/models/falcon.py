from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.alibi import falcon_alibi_slopes
from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import LayerNorm
from pagedgen.model_config import head_dim_of, num_kv_heads_of
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer, ParallelDecoderLayer, norm_eps
from pagedgen.models.llama import LayerOptions, LlamaForCausalLM
from pagedgen.models.names import renamed

# checkpoint names -> ours
RENAMES = (
    (r"^transformer\.", ""),
    (r"^word_embeddings\.", "embed_tokens."),
    (r"^ln_f\.", "norm."),
    (r"^h\.", "layers."),
    (r"\.self_attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.self_attention\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
    (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
    (r"\.ln_attn\.", ".input_layernorm."),
    (r"\.ln_mlp\.", ".post_attention_layernorm."),
)


class FalconForCausalLM(LlamaForCausalLM):
    """Falcon (falcon-7b, falcon-40b, falcon-180B, falcon-11B): LayerNorms with bias; with
    parallel_attn (or new_decoder_architecture) attention and the MLP side by side, reading one
    input_layernorm or, with the new architecture's num_ln_in_parallel_attn 2, ln_attn and
    ln_mlp; else the Llama order (post_attention_layernorm). q/k/v one tensor whose layout is
    per K/V group ([kv_heads, heads / kv_heads + 2, head_dim] rows: the group's queries, its
    key, its value; multi_query's one group, the old decoder's one group per head), reordered
    into our [q | k | v] rows as it loads; every linear biased where bias; an ungated MLP
    (activation gelu); the rotary embedding (rotate_half) over the whole head; lm_head tied
    to word_embeddings unless the checkpoint has one. With alibi (falcon-rw-1b, falcon-rw-7b),
    no rotary embedding but ALiBi, of falcon_alibi_slopes.

    FalconConfig names no num_key_value_heads: the K/V heads are num_kv_heads with the new
    architecture, one with multi_query, else every head (kv_geometry.num_kv_heads_of).
    """

    decoder_layer_cls = LayerNormDecoderLayer  # its make_norm: the final LayerNorm (ln_f)

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        new = config.new_decoder_architecture
        if new and not config.parallel_attn:  # transformers' layer has no ln_attn then
            raise ValueError("Falcon's new_decoder_architecture needs parallel_attn")
        if not new and config.parallel_attn and config.num_ln_in_parallel_attn == 2:
            raise ValueError("Falcon's num_ln_in_parallel_attn 2 needs new_decoder_architecture")
        heads, kv_heads = config.num_attention_heads, num_kv_heads_of(config)
        if not new and not config.multi_query and config.num_kv_heads not in (None, heads):
            raise ValueError("Falcon without multi_query has num_kv_heads = heads")
        if heads % kv_heads:
            raise ValueError(f"Falcon's {heads} heads are no multiple of its {kv_heads} K/V heads")
        super().__init__(config, backend, max_position)

    def layer_options(self, config: PretrainedConfig, index: int) -> LayerOptions:
        options = super().layer_options(config, index)
        if not config.alibi:
            return options
        slopes = falcon_alibi_slopes(config.num_attention_heads, head_dim_of(config))
        return replace(options, alibi_slopes=slopes)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        bias = bool(config.bias)
        attention = self.attention_cls(
            config, backend, bias, bias, self.layer_options(config, index)
        )
        mlp = MLP(config.hidden_size, config.ffn_hidden_size, config.activation, bias)
        if not config.parallel_attn:
            return LayerNormDecoderLayer(config, attention, mlp)
        eps = norm_eps(config)
        norm = LayerNorm(config.hidden_size, eps)
        if config.new_decoder_architecture and config.num_ln_in_parallel_attn in (None, 2):
            return ParallelDecoderLayer(attention, mlp, norm, LayerNorm(config.hidden_size, eps))
        return ParallelDecoderLayer(attention, mlp, norm)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._qkv_split(renamed(weights, RENAMES)))

    def _qkv_split(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """query_key_value's rows, group by group (each its queries, key, value), as
        [q | k | v]."""
        heads, head_dim = self.config.num_attention_heads, head_dim_of(self.config)
        kv_heads = num_kv_heads_of(self.config)
        for name, tensor in weights:
            if ".qkv_proj." in name:
                rest = tensor.shape[1:]
                groups = tensor.view(kv_heads, heads // kv_heads + 2, head_dim, *rest)
                q, k, v = groups[:, :-2], groups[:, -2], groups[:, -1]
                tensor = torch.cat([t.reshape(-1, *rest) for t in (q, k, v)])
            yield name, tensor
