from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.linear import Linear
from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import LayerNorm
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer, ParallelDecoderLayer, norm_eps
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM
from pagedgen.models.names import renamed

# checkpoint names -> ours (the "model." prefix is dropped later)
RENAMES = (
    (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.fc1\.", ".mlp.up_proj."),
    (r"\.mlp\.fc2\.", ".mlp.down_proj."),
    (r"^model\.final_layernorm\.", "model.norm."),
)


class PhiAttention(LlamaAttention):
    """Llama attention with every projection biased and, where qk_layernorm, a LayerNorm
    (biased, one weight shared by all heads) over each head of q and k before the rotary
    embedding."""

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        self.has_qk_norm = bool(config.qk_layernorm)
        if self.has_qk_norm:
            self.q_layernorm, self.k_layernorm = self.qk_layernorms(config.layer_norm_eps)

    def qk_layernorms(self, eps: float) -> tuple[LayerNorm, LayerNorm]:
        """Phi's: one biased LayerNorm over head_dim, which every head shares."""
        return LayerNorm(self.head_dim, eps), LayerNorm(self.head_dim, eps)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.has_qk_norm:
            return q, k
        return self.q_layernorm(q), self.k_layernorm(k)


class PhiForCausalLM(LlamaForCausalLM):
    """Phi-1, Phi-1.5 and Phi-2: a parallel block (one LayerNorm feeding both attention and
    the MLP, x + attn(ln(x)) + mlp(ln(x))), q/k/v and the output projection (dense) biased, the
    rotary embedding on the first partial_rotary_factor of each head, an ungated biased MLP
    (fc1, fc2) with hidden_act (gelu_new), a final LayerNorm (final_layernorm) and a biased
    lm_head. Checkpoint names are renamed to the Llama ones as they load."""

    attention_cls = PhiAttention
    decoder_layer_cls = LayerNormDecoderLayer  # its make_norm: the biased final LayerNorm

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=True)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        attention = self.attention_cls(
            config, backend, True, True, self.layer_options(config, index)
        )
        mlp = MLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=True)
        norm = LayerNorm(config.hidden_size, norm_eps(config))
        return ParallelDecoderLayer(attention, mlp, norm)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(renamed(weights, RENAMES))
