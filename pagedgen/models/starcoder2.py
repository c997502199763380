from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.mlp import MLP
from pagedgen.models.layernorm_decoder import LayerNormDecoderLayer
from pagedgen.models.llama import LlamaForCausalLM
from pagedgen.models.names import renamed

# checkpoint names -> ours (the "model." prefix is dropped later)
RENAMES = (
    (r"\.mlp\.c_fc\.", ".mlp.up_proj."),
    (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
)


class Starcoder2ForCausalLM(LlamaForCausalLM):
    """StarCoder2 (3B, 7B, 15B): the Llama decoder (Mistral's sliding window on every layer)
    with LayerNorms (biased, norm_epsilon), q/k/v and o biased where use_bias, an ungated MLP
    (c_fc, c_proj; gelu_pytorch_tanh) biased likewise, and lm_head tied to embed_tokens unless
    the checkpoint has one."""

    decoder_layer_cls = LayerNormDecoderLayer

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(config.use_bias), bool(config.use_bias)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        bias = bool(config.use_bias)
        return MLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(renamed(weights, RENAMES))
