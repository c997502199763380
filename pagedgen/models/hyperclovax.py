import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionMetadata
from pagedgen.layers.norm import RMSNorm, add_norm
from pagedgen.layers.rotary import Rope
from pagedgen.models.granite import GraniteForCausalLM
from pagedgen.models.llama import LlamaDecoderLayer


class HyperCLOVAXDecoderLayer(LlamaDecoderLayer):
    """Granite's layer with, where use_post_norm (Peri-LN), each sublayer's output normed
    (post_norm1, post_norm2) before residual_multiplier scales it into the stream."""

    def __init__(self, config: PretrainedConfig, attention: nn.Module, mlp: nn.Module) -> None:
        super().__init__(config, attention, mlp)
        self.post_norm1 = self.post_norm2 = None
        if config.use_post_norm:
            self.post_norm1 = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_norm2 = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        rope: Rope,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = add_norm(self.input_layernorm, hidden, residual)
        hidden = self._scaled(self.self_attn(rope, hidden, metadata), self.post_norm1)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self._scaled(self.mlp(hidden), self.post_norm2), residual

    def _scaled(self, out: torch.Tensor, post_norm: nn.Module | None) -> torch.Tensor:
        if post_norm is not None:
            out = post_norm(out)
        return out * self.residual_multiplier if self.residual_multiplier != 1.0 else out


class HyperCLOVAXForCausalLM(GraniteForCausalLM):
    """NAVER's HyperCLOVA X SEED (HyperCLOVAX-SEED-Think-14B): Granite's muP scalars, with
    logits multiplied by logits_scaling (Granite divides) and, where use_post_norm, each
    sublayer's output normed before it joins the residual stream."""

    decoder_layer_cls = HyperCLOVAXDecoderLayer

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) * self.config.logits_scaling
