from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import PretrainedConfig

from pagedgen.layers.linear import Linear
from pagedgen.layers.moe import SparseMoE
from pagedgen.models.llama import LlamaAttention, LlamaForCausalLM

SWIGLU_ALPHA = 1.702  # configs before transformers 5 do not name it
SWIGLU_LIMIT = 7.0  # nor do those of transformers 5.17, whose modeling fixes it at 7.0


class GptOssAttention(LlamaAttention):
    """Llama attention (biased projections) whose heads each have a learned sink: a logit that
    joins the head's softmax as a key of zero value, so a head may attend to nothing."""

    def make_sinks(self) -> nn.Parameter:
        sinks = torch.empty(self.num_heads, dtype=torch.float32)  # float32 whatever the model's
        return nn.Parameter(sinks, requires_grad=False)


class GptOssExpert(nn.Module):
    """One expert: SwiGLU with biases whose gate is clamped above and up clamped both ways at
    swiglu_limit, gate * sigmoid(alpha * gate) times (up + 1)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.gate_up_proj = Linear(hidden, [inter, inter], bias=True)
        self.down_proj = Linear(inter, hidden, bias=True)
        self.alpha = getattr(config, "swiglu_alpha", SWIGLU_ALPHA)
        self.limit = getattr(config, "swiglu_limit", SWIGLU_LIMIT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return self.down_proj((up + 1) * glu)


class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss: every MLP a mixture of num_local_experts experts (top num_experts_per_tok, the
    router biased and its top weights softmaxed), layers alternating between a sliding window
    and full attention (layer_types), attention sinks, YaRN rotary embeddings. Loads the dense
    checkpoints transformers writes and OpenAI's MXFP4 ones (dequantized as they load)."""

    attention_cls = GptOssAttention
    supports_graphs = False  # the expert routing reads token counts on the host

    def make_mlp(self, config: PretrainedConfig, index: int) -> nn.Module:
        return SparseMoE(
            config.hidden_size,
            config.num_local_experts,
            config.num_experts_per_tok,
            renormalize=True,
            make_expert=lambda: GptOssExpert(config),
            gate_bias=True,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(per_expert(weights))


def per_expert(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's stacked expert tensors as one Linear's weight and bias per expert, in
    the Llama loader's names: gate_up_proj [E, hidden, 2 * inter] (gate and up interleaved
    column by column) -> experts.e.gate_proj / up_proj [inter, hidden]; down_proj
    [E, inter, hidden] -> experts.e.down_proj [hidden, inter]; the router -> the gate."""
    for name, tensor in weights:
        name = name.replace(".mlp.router.", ".mlp.gate.")
        prefix, _, param = name.rpartition(".experts.")
        if not prefix:
            yield name, tensor
            continue
        kind, bias = param.removesuffix("_bias"), param.endswith("_bias")
        part = "bias" if bias else "weight"
        for e, expert in enumerate(tensor):
            stem = f"{prefix}.experts.{e}"
            matrix = expert if bias else expert.T
            if kind == "gate_up_proj":
                yield f"{stem}.gate_proj.{part}", matrix[0::2].contiguous()
                yield f"{stem}.up_proj.{part}", matrix[1::2].contiguous()
            elif kind == "down_proj":
                yield f"{stem}.down_proj.{part}", matrix.contiguous()
            else:
                raise ValueError(f"unexpected weight {name!r} in the checkpoint")
