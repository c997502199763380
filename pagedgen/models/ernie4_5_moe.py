from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.linear import Linear
from pagedgen.layers.moe import SparseMoE
from pagedgen.models.glm import Ernie4_5ForCausalLM
from pagedgen.models.llama import LlamaMLP


class Float32Router(nn.Module):
    """A router whose weight stays float32 and reads the hidden states widened to float32, as
    the checkpoints' reference computes it (transformers keeps such a gate in float32)."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        weight = torch.empty(num_experts, hidden_size, dtype=torch.float32)
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)


class Ernie4_5_MoeMoE(SparseMoE):
    """ERNIE 4.5's mixture: a float32 softmax router whose top moe_k experts are chosen by
    probability plus the e_score_correction_bias (moe_statics), weighted by the unbiased
    probabilities over their sum (at least moe_norm_min), in the model's dtype; plus
    moe_num_shared_experts shared experts (one MLP as wide), biased where use_bias (the routed
    experts never are)."""

    def __init__(self, config: PretrainedConfig) -> None:
        shared = config.moe_intermediate_size * (config.moe_num_shared_experts or 0)
        super().__init__(
            config.hidden_size,
            config.moe_num_experts,
            config.moe_k,
            renormalize=True,
            make_expert=lambda: LlamaMLP(config, config.moe_intermediate_size, bias=False),
            shared_expert=LlamaMLP(config, shared, bias=bool(config.use_bias)) if shared else None,
        )
        self.gate = Float32Router(config.hidden_size, config.moe_num_experts)
        bias = torch.empty(config.moe_num_experts, dtype=torch.float32)
        self.e_score_correction_bias = nn.Parameter(bias, requires_grad=False)
        self.norm_min = config.moe_norm_min

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = logits.softmax(dim=-1)
        experts = (probs + self.e_score_correction_bias).topk(self.top_k, dim=-1).indices
        weights = probs.gather(1, experts)
        return weights / weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min), experts


def ernie_is_moe_layer(config: PretrainedConfig, index: int) -> bool:
    end = config.moe_layer_end_index
    end = config.num_hidden_layers - 1 if end == -1 else end
    interval = config.moe_layer_interval
    return (index + 1) % interval == 0 and config.moe_layer_start_index <= index <= end


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    """ERNIE-4.5-21B-A3B and ERNIE-4.5-300B-A47B (their text decoders): dense ERNIE 4.5 (GLM-4's
    interleaved rotary pairs, every projection biased where use_bias, the LM head too) whose
    MLPs, from moe_layer_start_index to moe_layer_end_index every moe_layer_interval layers,
    are Ernie4_5_MoeMoE mixtures. The multi-token-prediction weights (mtp_*) are skipped, as
    transformers skips them."""

    supports_graphs = False  # the expert routing reads token counts on the host

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        if config.use_bias:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=True)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        if config.moe_num_experts and ernie_is_moe_layer(config, index):
            return Ernie4_5_MoeMoE(config)
        return LlamaMLP(config, bias=bool(config.use_bias))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_renamed(weights))


def _renamed(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The hub's names as ours: the correction bias ([1, num_experts], under mlp.moe_statics,
    or mlp.gate.moe_statics as transformers holds it) one vector of the MoE, shared_experts
    SparseMoE's shared_expert; the multi-token-prediction weights dropped."""
    for name, tensor in weights:
        if name.removeprefix("model.").startswith("mtp"):
            continue
        if name.endswith("moe_statics.e_score_correction_bias"):
            prefix = name.split(".mlp.")[0]
            name, tensor = f"{prefix}.mlp.e_score_correction_bias", tensor.reshape(-1)
        yield name.replace(".mlp.shared_experts.", ".mlp.shared_expert."), tensor
