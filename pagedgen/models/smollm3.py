from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.models.llama import LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """SmolLM3: the Llama decoder whose layers with no_rope_layers[i] == 0 (every fourth) attend
    without a rotary embedding (NoPE)."""

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        for attention, use_rope in zip(self.attention_layers, config.no_rope_layers, strict=True):
            attention.use_rope = bool(use_rope)
