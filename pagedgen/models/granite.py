import torch
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.models.llama import LlamaAttention, LlamaForCausalLM


class GraniteAttention(LlamaAttention):
    """Scores scaled by attention_multiplier, not head_dim ** -0.5."""

    def softmax_scale(self, config: PretrainedConfig) -> float:
        return config.attention_multiplier


class GraniteForCausalLM(LlamaForCausalLM):
    """IBM Granite 3: the Llama decoder with four scalars, as transformers applies them:
    embeddings times embedding_multiplier, attention scores times attention_multiplier, each
    sublayer's output times residual_multiplier before it joins the residual stream, and logits
    divided by logits_scaling."""

    attention_cls = GraniteAttention

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        super().__init__(config, backend, max_position)
        for layer in self.layers:
            layer.residual_multiplier = config.residual_multiplier

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.config.embedding_multiplier

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) / self.config.logits_scaling
