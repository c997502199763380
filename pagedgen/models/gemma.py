import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.models.gemma2 import GemmaMLP, GemmaRMSNorm
from pagedgen.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class GemmaDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with Gemma's RMSNorm, which scales by (1 + weight)."""

    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma (1) and CodeGemma: the Llama decoder with Gemma's norms, a GeGLU MLP (gelu_tanh of
    the gate), embeddings scaled by sqrt(hidden_size) (rounded to their dtype first, as the
    reference does) and the LM head tied to them. Gemma 2's soft-capping and sandwich norms came
    later (models/gemma2.py)."""

    decoder_layer_cls = GemmaDecoderLayer

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return GemmaMLP(config)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        return hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)
