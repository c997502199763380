from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.moe import SparseMoE
from pagedgen.models.granite import GraniteForCausalLM
from pagedgen.models.llama import LlamaMLP


class GraniteMoE(SparseMoE):
    """Granite's mixture: the top num_experts_per_tok router logits, softmaxed among themselves,
    weight the experts in the model's dtype; with a shared_intermediate_size (GraniteMoeShared),
    a shared expert."""

    def __init__(self, config: PretrainedConfig) -> None:
        shared = getattr(config, "shared_intermediate_size", 0)
        super().__init__(
            config.hidden_size,
            config.num_local_experts,
            config.num_experts_per_tok,
            renormalize=False,
            make_expert=lambda: LlamaMLP(config),
            shared_expert=LlamaMLP(config, shared) if shared else None,
        )

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, experts = logits.topk(self.top_k, dim=-1)
        return torch.softmax(top, dim=-1), experts


class GraniteMoeForCausalLM(GraniteForCausalLM):
    """Granite 3 MoE (granitemoe) and GraniteMoeShared: Granite's multipliers, every MLP a
    GraniteMoE. The checkpoints stack each layer's experts (input_linear [E, 2 I, hidden], gate
    rows first; output_linear [E, hidden, I]), loaded as one Linear pair per expert."""

    supports_graphs = False  # the expert routing reads token counts on the host

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return GraniteMoE(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_per_expert(weights))


def _per_expert(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Granite's MoE names as the Llama loader's: block_sparse_moe -> mlp, router.layer -> gate,
    shared_mlp -> mlp.shared_expert, the stacked experts one gate_proj / up_proj / down_proj
    each, the shared expert's halves."""
    for name, tensor in weights:
        name = name.replace(".block_sparse_moe.router.layer.", ".mlp.gate.")
        name = name.replace(".block_sparse_moe.", ".mlp.")
        name = name.replace(".shared_mlp.", ".mlp.shared_expert.")
        prefix, _, param = name.rpartition(".")
        if prefix.endswith("input_linear"):
            stem = prefix.removesuffix("input_linear")
            if tensor.dim() == 3:  # the routed experts
                for e, expert in enumerate(tensor):
                    gate, up = expert.chunk(2)
                    yield f"{stem}experts.{e}.gate_proj.{param}", gate
                    yield f"{stem}experts.{e}.up_proj.{param}", up
            else:
                gate, up = tensor.chunk(2)
                yield f"{stem}gate_proj.{param}", gate
                yield f"{stem}up_proj.{param}", up
        elif prefix.endswith("output_linear"):
            stem = prefix.removesuffix("output_linear")
            if tensor.dim() == 3:
                for e, expert in enumerate(tensor):
                    yield f"{stem}experts.{e}.down_proj.{param}", expert
            else:
                yield f"{stem}down_proj.{param}", tensor
        else:
            yield name, tensor
