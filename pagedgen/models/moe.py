from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.moe import SparseMoE
from pagedgen.models.llama import LlamaForCausalLM, LlamaMLP
from pagedgen.models.olmo2 import Olmo2Attention
from pagedgen.models.qwen3 import Qwen3ForCausalLM

MIXTRAL_NAMES = {"block_sparse_moe.": "mlp.", ".w1.": ".gate_proj.", ".w3.": ".up_proj.",
                 ".w2.": ".down_proj."}  # fmt: skip


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral: the Mistral decoder with every MLP a mixture of num_local_experts SwiGLU experts,
    top num_experts_per_tok per token, weights renormalized."""

    supports_graphs = False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return SparseMoE(
            config.hidden_size,
            config.num_local_experts,
            config.num_experts_per_tok,
            renormalize=True,
            make_expert=lambda: LlamaMLP(config),
            weights_in_float32=True,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_renamed(weights))


def _renamed(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Mixtral's checkpoint names as the Llama loader's (experts.E.w1 -> experts.E.gate_proj)."""
    for name, tensor in weights:
        for theirs, ours in MIXTRAL_NAMES.items():
            name = name.replace(theirs, ours)
        yield name, tensor


def qwen_mlp(config: PretrainedConfig, index: int, gated_shared_expert: bool = False) -> nn.Module:
    """Qwen2/3-MoE's MLP of layer index: dense in mlp_only_layers and off the
    decoder_sparse_step, else a mixture of num_experts experts of moe_intermediate_size, top
    num_experts_per_tok (renormalized where norm_topk_prob); with gated_shared_expert (Qwen2-MoE)
    a shared expert too, scaled by sigmoid(shared_expert_gate)."""
    dense = index in config.mlp_only_layers or not config.num_experts
    if dense or (index + 1) % config.decoder_sparse_step:
        return LlamaMLP(config)
    shared = gated_shared_expert and config.shared_expert_intermediate_size
    return SparseMoE(
        config.hidden_size,
        config.num_experts,
        config.num_experts_per_tok,
        renormalize=bool(config.norm_topk_prob),
        make_expert=lambda: LlamaMLP(config, config.moe_intermediate_size),
        shared_expert=LlamaMLP(config, shared) if shared else None,
        shared_expert_gate=gated_shared_expert,
    )


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE: the Qwen3 decoder whose MLPs are mixtures of num_experts SwiGLU experts of
    moe_intermediate_size, top num_experts_per_tok per token (renormalized where norm_topk_prob),
    except the layers in mlp_only_layers or off the decoder_sparse_step, which stay dense."""

    supports_graphs = False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return qwen_mlp(config, index)


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    """Qwen1.5-MoE and Qwen2-MoE: the Qwen2 decoder (q/k/v biased) whose MLPs, off
    mlp_only_layers and on the decoder_sparse_step, are mixtures (softmax top
    num_experts_per_tok, renormalized where norm_topk_prob, weighted in the model's dtype) with
    a shared expert every token goes through, its output scaled by sigmoid(shared_expert_gate)."""

    supports_graphs = False

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return bool(getattr(config, "qkv_bias", True)), False

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return qwen_mlp(config, index, gated_shared_expert=True)


class OlmoeForCausalLM(LlamaForCausalLM):
    """OLMoE: the Llama decoder with q and k normed over their whole projections (OLMo 2's
    norms) and every MLP a mixture of num_experts SwiGLU experts, top num_experts_per_tok
    (renormalized where norm_topk_prob, weighted in the model's dtype)."""

    attention_cls = Olmo2Attention
    supports_graphs = False

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        if getattr(config, "clip_qkv", None) is not None:
            raise ValueError("OLMoE's clip_qkv is not supported (no released checkpoint sets it)")
        super().__init__(config, backend, max_position)

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return SparseMoE(
            config.hidden_size,
            config.num_experts,
            config.num_experts_per_tok,
            renormalize=bool(config.norm_topk_prob),
            make_expert=lambda: LlamaMLP(config),
        )
