from collections.abc import Callable

import torch
from torch import nn

from pagedgen.layers.linear import Linear


class SparseMoE(nn.Module):
    """A mixture of experts routed top-k, as Mixtral, Qwen3-MoE and gpt-oss: the router's softmax in
    float32 picks top_k experts per token (their weights renormalized to sum to 1 where
    renormalize), and each expert, an MLP built by make_expert(), runs on its own tokens only.

    Each token's weighted expert outputs, rounded to the model's dtype, add up in expert order
    in float32 and round once (vLLM's moe_sum; in a float32 model, transformers' sums exactly).
    The gathers, the weighting and the sums are one op each for all experts; only the experts'
    matmuls run one expert at a time. A shared_expert (DeepSeek, Qwen2-MoE, Granite) runs on
    every token and its output is added to the routed one, scaled per token by
    sigmoid(shared_expert_gate(x)) where there is a gate (Qwen2-MoE). The routing reads the
    experts' token counts on the host, so steps of such a model run without graphs.
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        make_expert: Callable[[], nn.Module],
        weights_in_float32: bool = False,  # Mixtral scales in float32, Qwen3-MoE in the dtype
        gate_bias: bool = False,  # gpt-oss's router has one
        shared_expert: nn.Module | None = None,
        shared_expert_gate: bool = False,
    ) -> None:
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.weights_in_float32 = weights_in_float32
        self.gate = Linear(hidden_size, num_experts, bias=gate_bias)
        self.experts = nn.ModuleList(make_expert() for _ in range(num_experts))
        self.shared_expert = shared_expert
        self.shared_expert_gate = Linear(hidden_size, 1) if shared_expert_gate else None

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top_k (weights, experts) from the router's float32 logits."""
        weights, experts = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden_size]
        weights, experts = self.route(self.gate(x).float())
        if not self.weights_in_float32:
            weights = weights.to(x.dtype)
        flat = experts.flatten()
        order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert, tokens rising
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        tokens = order // self.top_k
        routed = x[tokens]  # a token's row once for each of its experts, grouped by expert
        outputs, start = [], 0
        for expert, count in zip(self.experts, counts):
            if count:
                outputs.append(expert(routed[start : start + count]))
                start += count
        y = torch.cat(outputs) * weights.flatten()[order, None]
        # one index_add_ over the rows in expert order: each token's in that order, in float32
        out = torch.zeros_like(x).index_add_(0, tokens, y.to(x.dtype))
        if self.shared_expert is None:
            return out
        shared = self.shared_expert(x)
        if self.shared_expert_gate is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out + shared
