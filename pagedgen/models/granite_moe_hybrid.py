from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.rotary import rope_parameters
from pagedgen.models.granite_moe import GraniteMoE, GraniteMoeForCausalLM
from pagedgen.models.llama import LlamaMLP

# transformers 5 reads a checkpoint's "mamba" / "attention" as "linear_attention" / "full_attention"
ATTENTION_LAYER_TYPES = ("attention", "full_attention")
MAMBA_LAYER_TYPES = ("mamba", "linear_attention")


class GraniteMoeHybridForCausalLM(GraniteMoeForCausalLM):
    """IBM Granite 4.0 (granitemoehybrid) with attention layers only: granite-4.0-micro,
    granite-4.0-1b and granite-4.0-350m. The hybrids (granite-4.0-h-*) have Mamba2 layers, which
    need a recurrent-state cache pagedgen does not have: they are refused.

    Granite MoE's decoder with Granite's four multipliers, but every layer has a shared MLP
    (shared_mlp, of shared_intermediate_size): with num_local_experts 0 it is the whole MLP,
    else it is the mixture's shared expert. Attention rotates q and k only where
    position_embedding_type is "rope"; None or "nope" (the hybrids') means no positional
    encoding at all.
    """

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        check_supported(config)
        super().__init__(config, backend, max_position)
        self.dense = config.num_local_experts == 0
        self.supports_graphs = self.dense
        use_rope = config.position_embedding_type == "rope"
        for attention in self.attention_layers:
            attention.use_rope = use_rope

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        if config.num_local_experts == 0:
            return LlamaMLP(config, config.shared_intermediate_size, bias=False)
        return GraniteMoE(config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_dense_shared_mlp(weights) if self.dense else weights)


def check_supported(config: PretrainedConfig) -> None:
    """Raises a ValueError for what this implementation does not compute as transformers does."""
    layer_types = list(config.layer_types or [])
    mamba = [i for i, kind in enumerate(layer_types) if kind in MAMBA_LAYER_TYPES]
    if mamba:
        raise ValueError(
            f"granitemoehybrid: layers {mamba} are Mamba2 layers (layer_types "
            f"{layer_types[mamba[0]]!r}); hybrid Mamba/attention models such as "
            "granite-4.0-h-* are not supported, as pagedgen has no recurrent-state cache; "
            "only models whose every layer is attention run"
        )
    unknown = sorted(set(layer_types) - set(ATTENTION_LAYER_TYPES))
    if unknown or len(layer_types) != config.num_hidden_layers:
        raise ValueError(
            f"granitemoehybrid: layer_types {layer_types} is not one of {ATTENTION_LAYER_TYPES} "
            f"per layer for {config.num_hidden_layers} layers"
        )
    position = config.position_embedding_type
    if position not in (None, "nope", "rope"):
        raise ValueError(f"granitemoehybrid: position_embedding_type {position!r} is not supported")
    params = rope_parameters(config)
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1))
    if position == "rope" and params["rope_type"] == "default" and factor != 1:
        # transformers' default rope for this model rotates the whole head whatever the factor
        raise ValueError(f"granitemoehybrid: partial_rotary_factor {factor} is not supported")
    if config.shared_intermediate_size <= 0:
        raise ValueError("granitemoehybrid: a shared_intermediate_size of 0 is not supported")


def _dense_shared_mlp(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Without experts the shared MLP is the layer's MLP: shared_mlp -> mlp, whose
    input_linear (gate rows first) and output_linear granite_moe's loader splits as a shared
    expert's."""
    for name, tensor in weights:
        yield name.replace(".shared_mlp.", ".mlp."), tensor
