import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from pagedgen.attention import AttentionBackend
from pagedgen.layers.linear import Linear
from pagedgen.layers.moe import SparseMoE
from pagedgen.layers.norm import LayerNorm
from pagedgen.layers.rotary import RotaryEmbedding, rope_angles, rope_parameters
from pagedgen.model_config import head_dim_of
from pagedgen.models.llama import LlamaDecoderLayer, LlamaMLP
from pagedgen.models.moe import MixtralForCausalLM


class SparseMixerMoE(SparseMoE):
    """Phi-3.5-MoE's mixture: Mixtral's experts routed by sparsemixer (inference), which picks
    the best expert and then the best of the rest, each weighted by a softmax over the logits
    within 2 * router_jitter_noise (relative) of its own, the others masked out."""

    def __init__(self, config: PretrainedConfig) -> None:
        if config.num_experts_per_tok != 2:
            raise ValueError("Phimoe's sparsemixer routes to 2 experts per token, no other number")
        super().__init__(
            config.hidden_size,
            config.num_local_experts,
            2,
            renormalize=False,
            make_expert=lambda: LlamaMLP(config),
        )
        self.jitter_eps = config.router_jitter_noise

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        best, first = logits.max(dim=-1, keepdim=True)
        weight_first = self._masked_softmax(logits, logits, best).gather(1, first)
        rest = logits.scatter(-1, first, float("-inf"))
        best_of_rest, second = rest.max(dim=-1, keepdim=True)
        weight_second = self._masked_softmax(rest, logits, best_of_rest).gather(1, second)
        return torch.cat((weight_first, weight_second), -1), torch.cat((first, second), -1)

    def _masked_softmax(
        self, scores: torch.Tensor, logits: torch.Tensor, threshold: torch.Tensor
    ) -> torch.Tensor:
        """softmax(scores) over the experts whose logits are within the relative jitter of
        threshold."""
        factor = logits.abs().clamp(min=threshold)
        far = (threshold - logits) / factor > 2 * self.jitter_eps
        return scores.masked_fill(far, float("-inf")).softmax(dim=-1)


class PhimoeRotaryEmbedding(RotaryEmbedding):
    """LongRoPE as transformers' Phimoe computes it: the short factors at every position, the
    cos and sin scaled by short_mscale, by long_mscale at positions past
    original_max_position_embeddings. (transformers' generate, once a sequence grows past that,
    recomputes it whole with long_mscale; the cache holds the keys as they were, so where the
    two mscales differ the positions before differ. Phi-3.5-MoE's are equal.)"""

    def __init__(self, config: PretrainedConfig, head_dim: int, max_position: int) -> None:
        params = rope_parameters(config)
        if params["rope_type"] == "default":
            super().__init__(config, head_dim, max_position)
            return
        if params["rope_type"] != "longrope":
            raise ValueError(f"Phimoe's rope_type {params['rope_type']!r} is not supported")
        nn.Module.__init__(self)
        inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"))
        freqs = rope_angles(inv_freq, max_position)
        positions = torch.arange(max_position, dtype=torch.float)
        long = positions[:, None] >= params["original_max_position_embeddings"]
        mscale = torch.where(
            long, torch.tensor(params["long_mscale"]), torch.tensor(params["short_mscale"])
        )
        self.register_buffer("cos", freqs.cos() * mscale, persistent=False)
        self.register_buffer("sin", freqs.sin() * mscale, persistent=False)


class PhimoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with LayerNorms (weight and bias) of epsilon rms_norm_eps."""

    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return LayerNorm(config.hidden_size, config.rms_norm_eps)


class PhimoeForCausalLM(MixtralForCausalLM):
    """Phi-3.5-MoE: Mixtral (checkpoint names and all) with LayerNorms for RMSNorms, every
    attention projection biased where attention_bias, the LM head where lm_head_bias,
    sparsemixer routing (SparseMixerMoE) and Phimoe's LongRoPE (PhimoeRotaryEmbedding)."""

    decoder_layer_cls = PhimoeDecoderLayer

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        self.rotary = PhimoeRotaryEmbedding(config, head_dim_of(config), max_position)
        if config.lm_head_bias:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=True)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return SparseMixerMoE(config)
