"""SparseMoE's batched dispatch against the plain per-expert loop, bit for bit: the same rows
through the same experts, each token's outputs added in expert order in float32 and rounded
once (in a float32 model, transformers' per-expert sums)."""

import pytest
import torch

from pagedgen.layers.linear import pack_linear_weights
from pagedgen.layers.moe import SparseMoE
from pagedgen.models.llama import LlamaMLP


class Config:
    hidden_size, intermediate_size, hidden_act, mlp_bias = 64, 96, "silu", False


def per_expert_loop(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Each expert on its own tokens, its weighted output (rounded to the model's dtype) added to
    theirs in float32, one expert at a time (transformers' order)."""
    weights, experts = moe.route(moe.gate(x).float())
    if not moe.weights_in_float32:
        weights = weights.to(x.dtype)
    out = torch.zeros_like(x, dtype=torch.float32)
    for e, expert in enumerate(moe.experts):
        token, slot = torch.where(experts == e)
        if len(token):
            y = expert(x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(x.dtype).float())
    return out.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weights_in_float32", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 3, 57])
def test_batched_dispatch_equals_the_per_expert_loop(dtype, weights_in_float32, num_tokens):
    torch.manual_seed(num_tokens)
    with torch.device("cpu"):
        moe = SparseMoE(64, 8, 3, True, lambda: LlamaMLP(Config()), weights_in_float32)
    for param in moe.parameters():
        param.data = torch.randn_like(param).mul_(0.3)
    moe = moe.to(dtype)
    pack_linear_weights(moe, dtype)  # the CPU's own matmul kernels, as a loaded model runs
    x = torch.randn(num_tokens, 64, dtype=dtype)
    assert torch.equal(moe(x), per_expert_loop(moe, x))
