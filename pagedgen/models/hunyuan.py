import copy
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.layers.moe import SparseMoE
from pagedgen.layers.norm import RMSNorm
from pagedgen.layers.rotary import Rope, rope_parameters
from pagedgen.model_config import head_dim_of
from pagedgen.models.ernie4_5_moe import Float32Router
from pagedgen.models.llama import LayerOptions, LlamaAttention, LlamaForCausalLM, LlamaMLP


def ntk_alpha_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config with HunYuan's rotary scaling as the plain kind it is: a "dynamic" one with an
    alpha is NTK scaling by a fixed alpha, the base theta * alpha ** (head_dim / (head_dim - 2))
    at every length (a copy with that theta; the config itself stays as it was)."""
    params = rope_parameters(config)
    if params["rope_type"] != "dynamic":
        return config
    if not params.get("alpha"):
        raise ValueError("HunYuan's dynamic rope without an alpha is not supported")
    head_dim = head_dim_of(config)
    config = copy.copy(config)
    theta = params["rope_theta"] * params["alpha"] ** (head_dim / (head_dim - 2))
    config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    return config


class HunYuanAttention(LlamaAttention):
    """Llama attention (every projection biased where attention_bias) whose q and k are normed
    per head (query_layernorm, key_layernorm) after the rotary embedding, not before."""

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
        self.query_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self, rope: Rope, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.qkv_proj.output_sizes, dim=-1)
        q = rope.apply(q.view(num_tokens, self.num_heads, self.head_dim))
        k = rope.apply(k.view(num_tokens, self.num_kv_heads, self.head_dim))
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.query_layernorm(q), self.key_layernorm(k)
        if self.qkv_scale is not None:  # after the norms, which would undo it
            q, k, v = q * self.k_scale, k / self.k_scale, v / self.v_scale
        out = self.attn.forward(q, k, v, self.key_cache, self.value_cache, metadata)
        return self.o_proj(self._unscaled(out).reshape(num_tokens, -1))


class HunYuanDenseV1ForCausalLM(LlamaForCausalLM):
    """Hunyuan dense (Hunyuan-0.5B to -7B): the Llama decoder with q and k normed per head after
    the rotary embedding (HunYuanAttention), MLPs never biased, and NTK rotary scaling by a
    fixed alpha (ntk_alpha_config)."""

    attention_cls = HunYuanAttention

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        if getattr(config, "use_cla", False):
            raise ValueError("HunYuan's cross-layer attention (use_cla) is not supported")
        if getattr(config, "use_qk_norm", True) is False:
            raise ValueError("HunYuan without q/k norms (use_qk_norm false) is not supported")
        super().__init__(ntk_alpha_config(config), backend, max_position)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return LlamaMLP(config, bias=False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_renamed(weights))


class HunYuanMoEV1ForCausalLM(HunYuanDenseV1ForCausalLM):
    """Hunyuan-A13B: Hunyuan dense whose every MLP is a mixture of num_experts SwiGLU experts
    of intermediate_size, a float32 softmax router (gate.wg) picking the top moe_topk (per
    layer where a list) renormalized, plus one shared expert as wide (shared_mlp), as
    transformers builds it: a config whose experts or shared experts are of another width or
    number is refused."""

    supports_graphs = False  # the expert routing reads token counts on the host

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        widths = _per_layer(getattr(config, "moe_intermediate_size", None), config)
        if any(width not in (None, config.intermediate_size) for width in widths):
            raise ValueError("HunYuan experts of moe_intermediate_size are not supported")
        if any(
            n not in (None, 1) for n in _per_layer(getattr(config, "num_shared_expert", 1), config)
        ):
            raise ValueError("HunYuan's num_shared_expert other than 1 is not supported")
        if not getattr(config, "use_mixed_mlp_moe", True):
            raise ValueError(
                "HunYuan without its shared expert (use_mixed_mlp_moe) is not supported"
            )
        if not isinstance(config.num_experts, int):
            raise ValueError("HunYuan's num_experts per layer is not supported")
        super().__init__(config, backend, max_position)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        moe = SparseMoE(
            config.hidden_size,
            config.num_experts,
            _per_layer(config.moe_topk, config)[index],
            renormalize=True,
            make_expert=lambda: LlamaMLP(config, bias=False),
            weights_in_float32=True,
            shared_expert=LlamaMLP(config, bias=False),
        )
        moe.gate = Float32Router(config.hidden_size, config.num_experts)
        return moe


def _per_layer(value: object, config: PretrainedConfig) -> list:
    """A config value given once or per layer, per layer."""
    return list(value) if isinstance(value, list) else [value] * config.num_hidden_layers


def _renamed(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's router (mlp.gate.wg) and shared expert (mlp.shared_mlp) as ours."""
    for name, tensor in weights:
        name = name.replace(".mlp.gate.wg.", ".mlp.gate.")
        yield name.replace(".mlp.shared_mlp.", ".mlp.shared_expert."), tensor
