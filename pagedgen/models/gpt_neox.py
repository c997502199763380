from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.linear import Linear
from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import LayerNorm
from pagedgen.layers.rotary import RotaryEmbedding, pairs_to_halves, reorder_heads
from pagedgen.model_config import head_dim_of, num_kv_heads_of
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer, ParallelDecoderLayer, norm_eps
from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.names import renamed

# checkpoint names -> ours
NEOX_RENAMES = (
    (r"^gpt_neox\.", ""),
    (r"^embed_in\.", "embed_tokens."),
    (r"^embed_out\.", "lm_head."),
    (r"^final_layer_norm\.", "norm."),
    (r"\.attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.attention\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
    (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
)
# buffers old checkpoints saved: the causal mask, its fill value, the rotary frequencies
NEOX_BUFFERS = r"\.attention\.(bias|masked_bias)$|\.rotary_emb\.inv_freq$"

GPTJ_RENAMES = (
    (r"^transformer\.", ""),
    (r"^wte\.", "embed_tokens."),
    (r"^ln_f\.", "norm."),
    (r"^h\.", "layers."),
    (r"\.ln_1\.", ".input_layernorm."),
    (r"\.attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.attn\.", ".self_attn."),
    (r"\.mlp\.fc_in\.", ".mlp.up_proj."),
    (r"\.mlp\.fc_out\.", ".mlp.down_proj."),
)
GPTJ_BUFFERS = r"\.attn\.(bias|masked_bias)$"


def check_all_kv_heads(config: PretrainedConfig) -> PretrainedConfig:
    """config, refused unless its K/V heads (num_kv_heads_of: none named means every head) are
    every head, as the architecture's fused q/k/v holds them."""
    heads = config.num_attention_heads
    if num_kv_heads_of(config) != heads:
        raise ValueError(
            f"{config.model_type} attends with every head: num_key_value_heads "
            f"{config.num_key_value_heads} (of {heads} heads) is not supported"
        )
    return config


def qkv_head_by_head(
    weights: Iterable[tuple[str, torch.Tensor]], config: PretrainedConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """A fused q/k/v laid out head by head (GPT-NeoX's, Persimmon's, BLOOM's query_key_value:
    rows [head 0: q k v, head 1: q k v, ...]) as our [q | k | v] rows; other tensors as they are."""
    heads, head_dim = config.num_attention_heads, head_dim_of(config)
    for name, tensor in weights:
        if ".qkv_proj." in name:
            rows = tensor.view(heads, 3, head_dim, *tensor.shape[1:])
            tensor = rows.transpose(0, 1).reshape(tensor.shape)
        yield name, tensor


class GPTNeoXForCausalLM(LlamaForCausalLM):
    """GPT-NeoX (Pythia, GPT-NeoX-20B, RedPajama-INCITE, Dolly v2): LayerNorms with bias; with
    use_parallel_residual, x + attn(ln1(x)) + mlp(ln2(x)), else the Llama order; the rotary
    embedding (rotate_half) on the first partial_rotary_factor (rotary_pct) of each head; q/k/v
    one tensor laid out head by head ([heads, 3, head_dim] rows), reordered into our
    [q | k | v] rows as it loads; q/k/v and the output projection (dense) biased where
    attention_bias; an ungated biased MLP; untied embed_in / embed_out."""

    decoder_layer_cls = LayerNormDecoderLayer  # its make_norm: the final LayerNorm

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(check_all_kv_heads(config), backend, max_position)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", True))
        attention = self.attention_cls(
            config, backend, bias, bias, self.layer_options(config, index)
        )
        mlp = MLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=True)
        if not config.use_parallel_residual:
            return LayerNormDecoderLayer(config, attention, mlp)
        eps = norm_eps(config)
        norms = LayerNorm(config.hidden_size, eps), LayerNorm(config.hidden_size, eps)
        return ParallelDecoderLayer(attention, mlp, *norms)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        weights = renamed(weights, NEOX_RENAMES, NEOX_BUFFERS)
        super().load_weights(qkv_head_by_head(weights, self.config))


class GPTJForCausalLM(LlamaForCausalLM):
    """GPT-J (GPT-J-6B): a parallel block with one LayerNorm (ln_1), x + attn(ln(x)) +
    mlp(ln(x)); q/k/v and out_proj unbiased; the rotary embedding on the first rotary_dim
    features of each head in interleaved pairs (rotate_every_two), whose q and k rows are
    reordered as they load (rotary.pairs_to_halves) so that our rotate_half applies; an ungated
    biased MLP (fc_in, fc_out; gelu_new); a final LayerNorm (ln_f) and a biased lm_head."""

    decoder_layer_cls = LayerNormDecoderLayer  # its make_norm: the final LayerNorm

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        if config.rotary_dim is None:  # transformers' rotary table then spans the whole model
            raise ValueError("GPT-J without rotary_dim is not supported")
        super().__init__(check_all_kv_heads(config), backend, max_position)
        # partial_rotary_factor 1 over rotary_dim: a table of exactly rotary_dim features
        self.rotary = RotaryEmbedding(self.config, config.rotary_dim, max_position)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=True)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        layer = self.layer_options(config, index)
        attention = self.attention_cls(config, backend, False, False, layer)
        inner = config.n_inner or 4 * config.hidden_size
        mlp = MLP(config.hidden_size, inner, config.activation_function, bias=True)
        norm = LayerNorm(config.hidden_size, norm_eps(config))
        return ParallelDecoderLayer(attention, mlp, norm)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._pairs_to_halves(renamed(weights, GPTJ_RENAMES, GPTJ_BUFFERS)))

    def _pairs_to_halves(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        order = pairs_to_halves(head_dim_of(self.config), 0, self.config.rotary_dim)
        for name, tensor in weights:
            if name.split(".")[-2] in ("q_proj", "k_proj"):
                tensor = reorder_heads(tensor, order)
            yield name, tensor
