from pagedgen.models.moe import OlmoeForCausalLM
from pagedgen.models.olmo2 import Olmo2ForCausalLM


class FlexOlmoForCausalLM(Olmo2ForCausalLM):
    """FlexOlmo (allenai/FlexOlmo-7x7B-1T): OLMo 2's decoder (a norm after each sublayer, none
    before; q and k normed over their whole projections) whose every MLP is OLMoE's mixture,
    a softmax over num_experts SwiGLU experts, top num_experts_per_tok (renormalized where
    norm_topk_prob, weighted in the model's dtype)."""

    supports_graphs = False  # the expert routing reads token counts on the host
    make_mlp = OlmoeForCausalLM.make_mlp
