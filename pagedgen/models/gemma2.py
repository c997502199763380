import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.linear import Linear
from pagedgen.layers.norm import ResidualNorm
from pagedgen.layers.rotary import Rope, RotaryEmbedding
from pagedgen.model_config import head_dim_of, layer_sliding_windows
from pagedgen.models.llama import LlamaAttention, LlamaForCausalLM


class GemmaRMSNorm(ResidualNorm):
    """Gemma's RMSNorm: scales by (1 + weight), all in float32, then rounds to the input dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class Gemma2Attention(LlamaAttention):
    """Scores scaled by query_pre_attn_scalar ** -0.5 (not head_dim's) and soft-capped."""

    def softmax_scale(self, config: PretrainedConfig) -> float:
        return config.query_pre_attn_scalar**-0.5

    def logits_soft_cap(self, config: PretrainedConfig) -> float | None:
        return getattr(config, "attn_logit_softcapping", None)


class GemmaMLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate) * up)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")
        inter = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, [inter, inter])
        self.down_proj = Linear(inter, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    """Four norms: around the attention and around the MLP, each output normed before the add."""

    def __init__(self, config: PretrainedConfig, attention: LlamaAttention) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = GemmaMLP(config)
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)

    def forward(
        self, rope: Rope, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        attn = self.self_attn(rope, self.input_layernorm(hidden), metadata)
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2: embeddings scaled by sqrt(hidden_size) and tied to the LM head, alternating
    local (sliding window) and global layers, attention and final logits soft-capped."""

    attention_cls = Gemma2Attention

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        nn.Module.__init__(self)
        self.config = config
        head_dim = head_dim_of(config)
        self.ropes = self.build_ropes(config, head_dim, max_position)
        self.layer_types = [
            "sliding_attention" if w else "full_attention" for w in layer_sliding_windows(config)
        ]
        embedding = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=embedding)
        self.embed_tokens.weight.requires_grad_(False)
        bias = bool(getattr(config, "attention_bias", False))
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(
                config,
                self.attention_cls(config, backend, bias, bias, self.layer_options(config, i)),
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)
        self.final_softcap = getattr(config, "final_logit_softcapping", None)

    @staticmethod
    def build_ropes(config: PretrainedConfig, head_dim: int, max_position: int) -> nn.ModuleDict:
        """One rotary table shared by every layer."""
        rope = RotaryEmbedding(config, head_dim, max_position)
        return nn.ModuleDict({"full_attention": rope, "sliding_attention": rope})

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        hidden = hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)
        ropes = {kind: rotary(positions) for kind, rotary in self.ropes.items()}
        for kind, layer in zip(self.layer_types, self.layers):
            hidden = layer(ropes[kind], hidden, metadata)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
