from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.moe import SparseMoE
from pagedgen.layers.rotary import pairs_to_halves, reorder_heads
from pagedgen.models.llama import LlamaForCausalLM, LlamaMLP
from pagedgen.models.mla import MLAAttention

SIGMOID_ROUTED = ("deepseek_v3", "glm4_moe")  # their transformers classes ignore scoring_func


class DeepseekMoE(SparseMoE):
    """DeepSeekMoE: n_routed_experts fine-grained experts, top num_experts_per_tok per token,
    their weights times routed_scaling_factor, plus n_shared_experts every token goes through
    (one MLP n_shared_experts times as wide). V2 routes by softmax (topk_method greedy, or
    group_limited_greedy: only the topk_group groups of experts with the highest best score);
    V3 and GLM-4.5 by sigmoid, choosing among the topk_group groups with the highest sum of
    their top two scores plus the e_score_correction_bias, the weights being the unbiased
    scores, normalized where norm_topk_prob. A config naming its scoring_func (sigmoid or
    softmax, as DeepSeek's own code and Kimi K2's do) routes so, whatever its model type."""

    def __init__(self, config: PretrainedConfig) -> None:
        default = "sigmoid" if config.model_type in SIGMOID_ROUTED else "softmax"
        self.sigmoid = (getattr(config, "scoring_func", None) or default) == "sigmoid"
        shared = config.moe_intermediate_size * (config.n_shared_experts or 0)
        super().__init__(
            config.hidden_size,
            config.n_routed_experts,
            config.num_experts_per_tok,
            renormalize=self.sigmoid and bool(config.norm_topk_prob),
            make_expert=lambda: LlamaMLP(config, config.moe_intermediate_size),
            weights_in_float32=True,
            shared_expert=LlamaMLP(config, shared) if shared else None,
        )
        self.topk_method = "noaux_tc" if self.sigmoid else config.topk_method
        if self.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ValueError(f"topk_method {self.topk_method!r} is not supported")
        self.num_groups, self.topk_groups = config.n_group, config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor
        self.e_score_correction_bias = (
            nn.Parameter(torch.empty(config.n_routed_experts, dtype=torch.float32), False)
            if self.sigmoid
            else None
        )

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens = logits.shape[0]
        if self.sigmoid:
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias
            grouped = choice.view(num_tokens, self.num_groups, -1)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            choice = self._in_top_groups(choice, group_scores, float("-inf"))
            experts = choice.topk(self.top_k, dim=-1).indices
            weights = scores.gather(1, experts)
            if self.renormalize:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            scores = logits.softmax(dim=-1)
            if self.topk_method == "group_limited_greedy":
                group_scores = scores.view(num_tokens, self.num_groups, -1).amax(dim=-1)
                scores = self._in_top_groups(scores, group_scores, 0.0)
            weights, experts = scores.topk(self.top_k, dim=-1)
        return weights * self.routed_scaling_factor, experts

    def _in_top_groups(
        self, scores: torch.Tensor, group_scores: torch.Tensor, fill: float
    ) -> torch.Tensor:
        """scores with those of experts outside each token's topk_group best groups as fill."""
        top = group_scores.topk(self.topk_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top, True)
        keep = keep.repeat_interleave(scores.shape[1] // self.num_groups, dim=1)
        return scores.masked_fill(~keep, fill)


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    """DeepSeek-V2 and V3 (and their derivatives: DeepSeek-R1, Kimi K2, Moonlight): multi-head
    latent attention (layers/mla.py) and DeepSeekMoE MLPs, dense in the first
    first_k_dense_replace layers. The checkpoints' rotary features are interleaved pairs, whose
    projection rows are reordered as they load (rotary.pairs_to_halves). V3's
    multi-token-prediction layers (past num_hidden_layers) are skipped, as transformers skips
    them."""

    attention_cls = MLAAttention
    supports_graphs = False  # the expert routing reads token counts on the host

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return deepseek_mlp(config, index)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._renamed(deepseek_names(weights, len(self.layers))))
        for attention in self.attention_layers:
            attention.absorb()

    def _renamed(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        config = self.config
        interleaved = config.model_type == "deepseek_v2" or getattr(config, "rope_interleave", True)
        rope, nope, rank = config.qk_rope_head_dim, config.qk_nope_head_dim, config.kv_lora_rank
        orders = {  # the rotary part last in each head of q, and in the latent
            "q_proj": pairs_to_halves(nope + rope, nope, rope),
            "q_b_proj": pairs_to_halves(nope + rope, nope, rope),
            "kv_a_proj_with_mqa": pairs_to_halves(rank + rope, rank, rope),
        }
        for name, tensor in weights:
            order = orders.get(name.split(".")[-2])
            yield name, tensor if order is None or not interleaved else reorder_heads(tensor, order)


def deepseek_mlp(config: PretrainedConfig, index: int) -> nn.Module:
    """Layer index's MLP: dense in the first first_k_dense_replace layers (and off
    moe_layer_freq), DeepSeekMoE elsewhere."""
    moe = config.n_routed_experts and index >= config.first_k_dense_replace
    moe = moe and index % getattr(config, "moe_layer_freq", 1) == 0
    return DeepseekMoE(config) if moe else LlamaMLP(config)


def deepseek_names(
    weights: Iterable[tuple[str, torch.Tensor]], num_layers: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint without its multi-token-prediction layers (numbered from num_layers on),
    the router's correction bias and the shared experts (one MLP) under SparseMoE's names."""
    for name, tensor in weights:
        parts = name.split(".")
        if "layers" in parts and int(parts[parts.index("layers") + 1]) >= num_layers:
            continue
        name = name.replace(".mlp.gate.e_score_correction_bias", ".mlp.e_score_correction_bias")
        yield name.replace(".mlp.shared_experts.", ".mlp.shared_expert."), tensor
