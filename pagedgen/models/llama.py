from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.attention.layer import Attention
from pagedgen.attention.spec import AttentionSpec
from pagedgen.layers.activation import SiluAndMul
from pagedgen.layers.linear import Linear
from pagedgen.layers.norm import RMSNorm, add_norm
from pagedgen.layers.rotary import Rope, RotaryEmbedding
from pagedgen.model_config import head_dim_of, layer_sliding_windows, num_kv_heads_of
from pagedgen.models.checkpoint_weights import load_checkpoint_weights


@dataclass(frozen=True, slots=True)
class LayerOptions:
    """What a model sets per layer of its attention, by the layer's index."""

    sliding_window: int | None = None
    scale: float | None = None  # None: the attention class's softmax_scale
    alibi_slopes: torch.Tensor | None = None  # [num_heads]: ALiBi in place of RoPE


class LlamaAttention(nn.Module):
    """Fused QKV projection, RoPE, paged attention and the output projection. The layer's
    attention constants are its AttentionSpec, made here once: the scale (softmax_scale, or the
    model's per layer), the model's sliding window and ALiBi slopes for this layer, the soft cap
    (logits_soft_cap) and the sinks parameter (make_sinks) of the subclasses that have them."""

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = num_kv_heads_of(config)  # as the KV cache is sized
        self.head_dim = head_dim_of(config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, [q_size, kv_size, kv_size], bias=qkv_bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=o_bias)
        self.sinks = self.make_sinks()
        alibi_slopes = None
        if layer.alibi_slopes is not None:  # float32 on the device the model is built on
            self.use_rope = False
            slopes = layer.alibi_slopes
            alibi_slopes = torch.empty(slopes.shape, dtype=torch.float32).copy_(slopes)
        scale = self.softmax_scale(config) if layer.scale is None else layer.scale
        spec = AttentionSpec(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            scale,
            layer.sliding_window,
            self.logits_soft_cap(config),
            self.sinks,
            alibi_slopes,
        )
        self.attn = Attention(spec, backend)
        # Bound by the model runner to its pool: [num_blocks, block_size, num_kv_heads, head_dim].
        self.key_cache = torch.empty(0)
        self.value_cache = torch.empty(0)
        self.k_scale = self.v_scale = 1.0  # the checkpoint's KV scales (models/kv_scales.py)
        self.qkv_scale: torch.Tensor | None = None  # set by use_kv_scales

    def softmax_scale(self, config: PretrainedConfig) -> float:
        return self.head_dim**-0.5

    def logits_soft_cap(self, config: PretrainedConfig) -> float | None:
        return None

    def make_sinks(self) -> nn.Parameter | None:
        """Per head, a learned logit in its softmax (gpt-oss): loaded from the checkpoint."""
        return None

    def forward(
        self, rope: Rope, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        scaled = self.qkv_scale is not None
        if scaled and not self.has_qk_norm:  # RoPE is linear: scaled before it or after, alike
            qkv = qkv.mul_(self.qkv_scale)  # in qkv's dtype
        if not self.has_qk_norm:  # RoPE (if any) and the cache write may be one fused op
            rotary = rope if self.use_rope else None
            out = self.attn.forward_qkv(qkv, rotary, self.key_cache, self.value_cache, metadata)
            return self.o_proj(self._unscaled(out).reshape(num_tokens, -1))
        q, k, v = qkv.split(self.qkv_proj.output_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.normalize_qk(q, k)
        if scaled and self.has_qk_norm:  # after the norms, which would undo it
            q, k, v = q * self.k_scale, k / self.k_scale, v / self.v_scale
        if self.use_rope:
            q, k = rope.apply(q), rope.apply(k)
        out = self.attn.forward(q, k, v, self.key_cache, self.value_cache, metadata)
        return self.o_proj(self._unscaled(out).reshape(num_tokens, -1))

    def use_kv_scales(self, enabled: bool) -> bool:
        """With enabled (an 8-bit cache), K and V go to the cache as k / k_scale and
        v / v_scale, as vLLM stores them; the query is scaled by k_scale and the output by
        v_scale instead of each cached value, so attention computes what it would unscaled, in
        every backend. Returns whether any scale is not 1."""
        weight = self.qkv_proj.weight
        self.qkv_scale = None
        if not enabled or (self.k_scale, self.v_scale) == (1.0, 1.0):
            return False
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        scales = [self.k_scale] * q_size + [1 / self.k_scale] * kv_size
        scales += [1 / self.v_scale] * kv_size
        self.qkv_scale = torch.tensor(scales, dtype=torch.float32).to(weight.device)
        return True

    def _unscaled(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.qkv_scale is None else out * self.v_scale

    has_qk_norm = False  # Qwen3: normalize_qk runs between the projection and RoPE
    use_rope = True  # SmolLM3: every fourth layer has no positional encoding

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class LlamaMLP(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        intermediate_size: int | None = None,
        bias: bool | None = None,  # default: the config's mlp_bias
    ) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
        bias = getattr(config, "mlp_bias", False) if bias is None else bias
        inter = intermediate_size or config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, [inter, inter], bias=bias)
        self.down_proj = Linear(inter, config.hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    residual_multiplier = 1.0  # Granite: each sublayer's output is scaled before the add

    def __init__(self, config: PretrainedConfig, attention: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = self.make_norm(config)
        self.post_attention_layernorm = self.make_norm(config)

    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        """The layer's norms and the model's final one: RMSNorm; LayerNorm in older decoders."""
        return RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        rope: Rope,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Takes and returns (hidden, residual) as vLLM's layers do: the residual stream gets
        each sublayer's output added at the next norm, in one fused op."""
        hidden, residual = add_norm(self.input_layernorm, hidden, residual)
        hidden = self.self_attn(rope, hidden, metadata)
        if self.residual_multiplier != 1.0:
            hidden = hidden * self.residual_multiplier
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        hidden = self.mlp(hidden)
        if self.residual_multiplier != 1.0:
            hidden = hidden * self.residual_multiplier
        return hidden, residual


class LlamaForCausalLM(nn.Module):
    """Llama 2/3, Mistral, SmolLM2, Qwen2 (QKV bias) and Seed-OSS (QKV bias, o's its own): one
    decoder, names as in the checkpoints.
    Layers with a sliding window (Mistral's sliding_window, Qwen2's use_sliding_window) attend
    to their window only.

    forward() takes the flattened varlen batch and returns hidden states for every token;
    compute_logits() is applied by the runner to the rows it samples from only; its logits stay
    in the model's dtype, which the sampler widens to float32 where it needs more than an argmax.
    """

    attention_cls = LlamaAttention
    decoder_layer_cls = LlamaDecoderLayer
    supports_graphs = True  # a decode step's ops are the same whatever its tokens

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(config, head_dim_of(config), max_position)
        # Loaded from the checkpoint: no random init (it took ~0.3 s of every start-up).
        embedding = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=embedding)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(
            self.make_layer(config, backend, i) for i in range(config.num_hidden_layers)
        )
        layer_cls = self.decoder_layer_cls  # the final norm is of its layers' kind
        maker = layer_cls if issubclass(layer_cls, LlamaDecoderLayer) else LlamaDecoderLayer
        self.norm = maker.make_norm(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    def make_layer(
        self, config: PretrainedConfig, backend: AttentionBackend, index: int
    ) -> nn.Module:
        biases, layer = self.attention_biases(config), self.layer_options(config, index)
        attention = self.attention_cls(config, backend, *biases, layer=layer)
        return self.decoder_layer_cls(config, attention, self.make_mlp(config, index))

    def layer_options(self, config: PretrainedConfig, index: int) -> LayerOptions:
        """Layer index's sliding window (layer_sliding_windows), scale and ALiBi slopes."""
        return LayerOptions(sliding_window=layer_sliding_windows(config)[index])

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        """Layer index's MLP: dense here; a mixture of experts where a model has them."""
        return LlamaMLP(config)

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        if config.model_type == "qwen2":
            return True, False
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bool(getattr(config, "attention_out_bias", bias))  # Seed-OSS names o's

    @property
    def attention_layers(self) -> list[LlamaAttention]:
        return [layer.self_attn for layer in self.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        hidden, residual = self.embed(input_ids), None
        for rope, layer in zip(self.layer_ropes(positions), self.layers):
            hidden, residual = layer(rope, hidden, residual, metadata)
        return self.norm(hidden, residual)[0]

    def layer_ropes(self, positions: torch.Tensor) -> list[Rope]:
        """Each layer's cos and sin rows for the step: one table's, looked up once for all."""
        return [self.rotary(positions)] * len(self.layers)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def derived_weights(self) -> set[str]:
        """Sets parameters computed from loaded ones (after every checkpoint tensor, the LM head
        tied); returns their names. None here."""
        return set()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads checkpoint tensors by their Hugging Face names; every parameter must be set."""
        load_checkpoint_weights(self, weights, self.derived_weights)
