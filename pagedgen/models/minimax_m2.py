import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.moe import SparseMoE
from pagedgen.models.llama import LlamaMLP
from pagedgen.models.moe import MixtralForCausalLM
from pagedgen.models.olmo2 import Olmo2Attention


class BiasedSigmoidMoE(SparseMoE):
    """MiniMax-M2's routing: sigmoid scores; the top num_experts_per_tok of the scores plus the
    e_score_correction_bias chosen, weighted by their unbiased scores renormalized."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(
            config.hidden_size,
            config.num_local_experts,
            config.num_experts_per_tok,
            renormalize=True,
            make_expert=lambda: LlamaMLP(config),
            weights_in_float32=True,
        )
        bias = torch.empty(config.num_local_experts, dtype=torch.float32)
        self.e_score_correction_bias = nn.Parameter(bias, requires_grad=False)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = logits.sigmoid()
        experts = (scores + self.e_score_correction_bias).topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        return weights / weights.sum(dim=-1, keepdim=True), experts


class MiniMaxM2ForCausalLM(MixtralForCausalLM):
    """MiniMax-M2: the Llama decoder with q and k normed over their whole projections (OLMo 2's
    norms), rotary embeddings on part of each head (the checkpoint's rotary_dim), and every MLP
    a BiasedSigmoidMoE mixture; its checkpoints name the experts (and the routing bias) as
    Mixtral's loader reads them."""

    attention_cls = Olmo2Attention

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return False, False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return BiasedSigmoidMoE(config)
