import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.mlp import MLP
from pagedgen.layers.norm import LayerNorm
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer
from pagedgen.models.llama import LlamaForCausalLM


class LayerNorm1P(LayerNorm):
    """Nemotron's LayerNorm, whose checkpoint weight is stored less one: it scales by weight + 1
    (added at each call, in the weight's dtype, as transformers' NemotronLayerNorm1P does)."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight + 1.0, self.bias, self.eps)


class NemotronDecoderLayer(LayerNormDecoderLayer):
    """The Llama layer with LayerNorm1P (biased) for RMSNorm; the final norm is one too."""

    @classmethod
    def make_norm(cls, config: PretrainedConfig) -> nn.Module:
        return LayerNorm1P(config.hidden_size, config.norm_eps)


def relu2_mlp(config: PretrainedConfig) -> nn.Module:
    """The ungated MLP down(act(up(x))), act hidden_act (relu2: relu(x) ** 2), biased where
    mlp_bias; checkpoints name it up_proj and down_proj, as ours are."""
    bias = bool(getattr(config, "mlp_bias", False))
    return MLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias)


class NemotronForCausalLM(LlamaForCausalLM):
    """Nemotron-4 and Minitron: the Llama decoder with LayerNorm1P (a biased LayerNorm scaling
    by weight + 1) for RMSNorm, the rotary embedding on the first partial_rotary_factor of each
    head (0.5 by default), every attention projection biased where attention_bias (o too), and
    an ungated relu2 MLP (up_proj, down_proj)."""

    decoder_layer_cls = NemotronDecoderLayer

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        bias = bool(config.attention_bias)
        return bias, bias

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return relu2_mlp(config)


class ArceeForCausalLM(LlamaForCausalLM):
    """Arcee AFM-4.5B: the Llama decoder (RMSNorm, full rotary embedding, YaRN scaling) with
    Nemotron's ungated relu2 MLP (up_proj, down_proj) for the gated silu one."""

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return relu2_mlp(config)
