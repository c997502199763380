from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.model_config import layer_sliding_windows
from pagedgen.models.olmo2 import Olmo2ForCausalLM
from pagedgen.models.qwen3 import Qwen3Attention


class Exaone4ForCausalLM(Olmo2ForCausalLM):
    """EXAONE 4.0: OLMo 2's layers (a norm after each sublayer, none before) with Qwen3's q/k
    norms per head; where the config has a sliding window, the layers layer_types names attend
    through it and the full-attention ones take no rotary embedding (NoPE)."""

    attention_cls = Qwen3Attention

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        if getattr(config, "sliding_window", None) is not None:
            windows = layer_sliding_windows(config)
            for attention, window in zip(self.attention_layers, windows, strict=True):
                attention.use_rope = window is not None
