import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.norm import RMSNorm
from pagedgen.layers.rotary import Rope, layer_type_ropes
from pagedgen.model_config import head_dim_of
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM


class Olmo2Attention(LlamaAttention):
    """Llama attention with an RMSNorm over the whole q and k projections (all heads at once),
    before the rotary embedding."""

    has_qk_norm = True

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__(config, backend, qkv_bias, o_bias, layer)
        self.q_norm = RMSNorm(self.num_heads * self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.num_kv_heads * self.head_dim, config.rms_norm_eps)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens = q.shape[0]
        q = self.q_norm(q.reshape(num_tokens, -1)).view_as(q)
        return q, self.k_norm(k.reshape(num_tokens, -1)).view_as(k)


class Olmo2DecoderLayer(nn.Module):
    """Norms after each sublayer, before its output joins the residual stream; none before."""

    def __init__(self, config: PretrainedConfig, attention: LlamaAttention, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        rope: Rope,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) as the Llama layers pass them: the stream is their sum."""
        stream = hidden if residual is None else residual + hidden
        stream = stream + self.post_attention_layernorm(self.self_attn(rope, stream, metadata))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2: post-sublayer norms and whole-projection q/k norms on the Llama decoder."""

    attention_cls = Olmo2Attention
    decoder_layer_cls = Olmo2DecoderLayer


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    """OLMo 3: OLMo 2 with sliding-window attention on the layers layer_types names (three of
    four) and a rotary table per kind of layer (rope_parameters by layer type)."""

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        del self.rotary  # one table per kind instead
        self.ropes = layer_type_ropes(config, head_dim_of(config), max_position)
        self.layer_types = config.layer_types

    def layer_ropes(self, positions: torch.Tensor) -> list[Rope]:
        ropes = {kind: rotary(positions) for kind, rotary in self.ropes.items()}
        return [ropes[kind] for kind in self.layer_types]
