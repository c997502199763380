import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.norm import LayerNorm
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer, ParallelDecoderLayer, norm_eps
from pagedgen.models.llama import LlamaForCausalLM, LlamaMLP
from pagedgen.models.phi import PhiAttention

# A head's q or k LayerNorm weight as checkpoints save it: one nn.LayerNorm per head.
PER_HEAD_NORM = re.compile(r"^(.*\.[qk]_layernorm)\.norms\.(\d+)\.weight$")


class StableLmAttention(PhiAttention):
    """Llama attention with q/k/v biased where use_qkv_bias and, where qk_layernorm (StableLM 2
    12B), a LayerNorm without bias over each head of q and k, with a weight of its own per head,
    before the rotary embedding."""

    def qk_layernorms(self, eps: float) -> tuple[LayerNorm, LayerNorm]:
        q_norm = LayerNorm((self.num_heads, self.head_dim), eps, bias=False)
        return q_norm, LayerNorm((self.num_kv_heads, self.head_dim), eps, bias=False)


class StableLmForCausalLM(LlamaForCausalLM):
    """StableLM-3B-4E1T and StableLM 2 (1.6B, 12B): the Llama decoder (gated silu MLP, names as
    Llama's) with biased LayerNorms for RMSNorms, the rotary embedding on the first
    partial_rotary_factor of each head, q/k/v biased where use_qkv_bias (o never), per-head q/k
    LayerNorms where qk_layernorm, and where use_parallel_residual the parallel block
    x + attn(ln(x)) + mlp(ln(x)) (no post_attention_layernorm)."""

    attention_cls = StableLmAttention
    decoder_layer_cls = LayerNormDecoderLayer

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        head_dim = config.hidden_size // config.num_attention_heads
        if getattr(config, "head_dim", None) not in (None, head_dim):
            # transformers takes hidden_size / num_attention_heads whatever the config says
            raise ValueError(f"head_dim {config.head_dim} is not supported (only {head_dim})")
        super().__init__(config, backend, max_position)

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.use_qkv_bias), False

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        if not config.use_parallel_residual:
            return super().make_layer(config, backend, index)
        biases, layer = self.attention_biases(config), self.layer_options(config, index)
        attention = self.attention_cls(config, backend, *biases, layer)
        norm = LayerNorm(config.hidden_size, norm_eps(config))
        return ParallelDecoderLayer(attention, self.make_mlp(config, index), norm)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return LlamaMLP(config, bias=False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._stack_head_norms(weights))

    def _stack_head_norms(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors, with each q/k norm's per-head weights (q_layernorm.norms.
        {h}.weight) stacked into the one [num_heads, head_dim] weight ours holds, once all are
        read."""
        heads: dict[str, dict[int, torch.Tensor]] = {}
        for name, tensor in weights:
            if match := PER_HEAD_NORM.match(name):
                heads.setdefault(match[1], {})[int(match[2])] = tensor
            else:
                yield name, tensor
        for norm, rows in heads.items():
            if sorted(rows) != list(range(len(rows))):
                raise ValueError(f"{norm} lacks heads: has {sorted(rows)}")
            yield f"{norm}.weight", torch.stack([rows[h] for h in range(len(rows))])
