from collections.abc import Iterable, Iterator

import torch

from pagedgen.models.llama import LlamaForCausalLM

# Phi-3's checkpoint projections, fused already: (our module, the checkpoint's parts in order)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 and Phi-4-mini: the Llama decoder with q/k/v and gate/up fused in the checkpoint,
    and a partial rotary embedding on Phi-4-mini (RotaryEmbedding reads the factor). The 128k
    models' LongRoPE takes its short factors at every position, which transformers does up to
    original_max_position_embeddings tokens (it switches the whole sequence to the long ones
    past that, vLLM every token of a batch that holds such a position)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._split_fused(weights))

    def _split_fused(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Each fused tensor as the Llama checkpoint's parts (rows in order), which the Llama
        loader fuses again."""
        modules = dict(self.named_modules())
        for name, tensor in weights:
            module_name, _, param_name = name.rpartition(".")
            prefix, _, proj = module_name.rpartition(".")
            if proj not in FUSED:
                yield name, tensor
                continue
            ours = modules[f"{prefix.removeprefix('model.')}.{proj}"]
            parts = tensor.split(ours.output_sizes, dim=0)
            for part_name, part in zip(FUSED[proj], parts, strict=True):
                yield f"{prefix}.{part_name}.{param_name}", part
