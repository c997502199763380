"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2), as vLLM runs it: the cache holds one
latent vector per token, and attention runs in the latent space with the up-projection absorbed.

Per token, kv_a_proj_with_mqa gives c (kv_lora_rank, normed) and k_pe (qk_rope_head_dim, rotated);
head h's key is [W_UK[h] c, k_pe] and its value W_UV[h] c, W_UK and W_UV the two parts of
kv_b_proj. Since q_nope . (W_UK c) = (W_UK^T q_nope) . c, every head attends with the query
[W_UK[h]^T q_nope, q_pe] over the keys [c, k_pe], one vector shared by all heads (MQA with
head_dim kv_lora_rank + qk_rope_head_dim), and its output's first kv_lora_rank features, the
softmax-weighted sum of the c's, times W_UV[h] are the head's output. So the paged cache stores
[c, k_pe] once per token and layer (576 values for DeepSeek-V3, where caching each head's K and V
would take 128 x (192 + 128)), and every attention backend serves it unchanged: the latent is
passed as both key and value (its k_pe features come out of the weighted sum too, and are
dropped).
"""

import math

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.attention.layer import Attention
from pagedgen.attention.spec import AttentionSpec
from pagedgen.layers.linear import Linear
from pagedgen.layers.norm import RMSNorm
from pagedgen.layers.rotary import Rope, rope_parameters
from pagedgen.models.llama import LayerOptions

LATENT_NORM_EPS = 1e-6  # the reference's q_a_layernorm and kv_a_layernorm take no config eps


def mla_softmax_scale(config: PretrainedConfig) -> float:
    """qk_head_dim^-0.5, times YaRN's mscale squared where the config scales RoPE with an
    mscale_all_dim (DeepSeek-V3: the long-context attention temperature)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim", 0)
    if params["rope_type"] != "default" and mscale_all_dim and params["factor"] > 1:
        mscale = 0.1 * mscale_all_dim * math.log(params["factor"]) + 1.0
        scale *= mscale * mscale
    return scale


class MLAAttention(nn.Module):
    """DeepSeek's attention: the query through a low-rank q_a_proj / q_a_layernorm / q_b_proj
    (or one q_proj where q_lora_rank is None), keys and values from the cached latent. The
    loader calls absorb() once kv_b_proj is loaded; its weights then live in w_uk and w_uv."""

    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        qkv_bias: bool,
        o_bias: bool,
        layer: LayerOptions = LayerOptions(),
    ) -> None:
        """Takes the Llama layers' arguments; its biases are the config's attention_bias (the
        low-rank inputs' and the output's), not qkv_bias and o_bias."""
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = 1
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.head_dim = self.kv_lora_rank + self.qk_rope_head_dim  # what the cache holds
        hidden, heads = config.hidden_size, self.num_heads
        q_size = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        bias = bool(getattr(config, "attention_bias", False))
        self.q_lora_rank = config.q_lora_rank
        if self.q_lora_rank is None:
            self.q_proj = Linear(hidden, q_size)
        else:
            self.q_a_proj = Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(self.q_lora_rank, q_size)
        self.kv_a_proj_with_mqa = Linear(hidden, self.head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj: Linear | None = Linear(
            self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim)
        )
        self.o_proj = Linear(heads * self.v_head_dim, hidden, bias=bias)
        self.w_uk: nn.Parameter | None = None  # [heads, qk_nope_head_dim, kv_lora_rank]
        self.w_uv: nn.Parameter | None = None  # [heads, kv_lora_rank, v_head_dim]
        scale = mla_softmax_scale(config) if layer.scale is None else layer.scale
        spec = AttentionSpec(heads, 1, self.head_dim, scale, layer.sliding_window)
        self.attn = Attention(spec, backend)
        # Bound by the model runner to its pool: [num_blocks, block_size, 1, head_dim], the
        # same tensor as both.
        self.key_cache = torch.empty(0)
        self.value_cache = torch.empty(0)

    def absorb(self) -> None:
        """Splits the loaded kv_b_proj into W_UK and W_UV, laid out for the batched matmuls,
        and drops it."""
        assert self.kv_b_proj is not None
        heads, nope, v = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
        weight = self.kv_b_proj.weight.view(heads, nope + v, self.kv_lora_rank)
        self.w_uk = nn.Parameter(weight[:, :nope].contiguous(), requires_grad=False)
        self.w_uv = nn.Parameter(weight[:, nope:].transpose(1, 2).contiguous(), requires_grad=False)
        self.kv_b_proj = None

    def use_kv_scales(self, enabled: bool) -> bool:
        """DeepSeek checkpoints carry no KV scales: an 8-bit cache stores the latent as is."""
        return False

    def forward(
        self, rope: Rope, hidden: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens, heads, rank = hidden.shape[0], self.num_heads, self.kv_lora_rank
        if self.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_pe = q.view(num_tokens, heads, -1).split(
            [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1
        )
        c_kv, k_pe = self.kv_a_proj_with_mqa(hidden).split([rank, self.qk_rope_head_dim], -1)
        c_kv = self.kv_a_layernorm(c_kv.contiguous())
        k_pe = rope.apply(k_pe.reshape(num_tokens, 1, self.qk_rope_head_dim))
        # [heads, tokens, nope] x [heads, nope, rank]: each head's query in the latent space
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)
        query = torch.cat([q_latent, rope.apply(q_pe)], dim=-1)
        latent = torch.cat([c_kv.unsqueeze(1), k_pe], dim=-1)  # [tokens, 1, head_dim]
        out = self.attn.forward(query, latent, latent, self.key_cache, self.value_cache, metadata)
        # [heads, tokens, rank] x [heads, rank, v]: the weighted latents up to each head's value
        out = torch.bmm(out[..., :rank].transpose(0, 1), self.w_uv)
        return self.o_proj(out.transpose(0, 1).reshape(num_tokens, heads * self.v_head_dim))
