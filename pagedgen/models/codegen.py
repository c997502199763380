"""CodeGen (Salesforce codegen-350M to 16B, mono, multi and nl): GPT-J with one fused q/v/k
projection laid out across the 4 model-parallel shards it was trained with."""

import re
from collections.abc import Iterable, Iterator

import torch
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.models.gpt_neox import GPTJForCausalLM

MP_NUM = 4  # transformers' CodeGenAttention.mp_num: fixed, whatever the config
QKV_PROJ = re.compile(r"^(.*\.attn\.)qkv_proj\.weight$")
# the causal mask older checkpoints saved (transformers ignores it on load)
CODEGEN_BUFFERS = re.compile(r"\.attn\.causal_mask$")


class CodeGenForCausalLM(GPTJForCausalLM):
    """CodeGen: GPT-J (a parallel block x + attn(ln_1(x)) + mlp(ln_1(x)), the rotary embedding
    on the first rotary_dim features of each head in interleaved pairs, unbiased attention, an
    ungated biased gelu_new MLP fc_in / fc_out, ln_f, a biased lm_head) whose q, k and v come
    from one unbiased qkv_proj: its rows are 4 shards, each [q | v | k] of hidden_size / 4 rows
    (note v before k), every projection's shards in turn making its heads. They are split into
    q_proj, k_proj and v_proj as they load, and then rotate as GPT-J's do."""

    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
    ) -> None:
        if config.hidden_size % MP_NUM:
            raise ValueError(f"CodeGen's hidden_size must be a multiple of {MP_NUM}")
        super().__init__(config, backend, max_position)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._split_qkv(weights))

    def _split_qkv(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """qkv_proj's [shard, (q, v, k), hidden_size / 4] rows as q_proj, k_proj and v_proj."""
        for name, tensor in weights:
            if CODEGEN_BUFFERS.search(name):
                continue
            if not (match := QKV_PROJ.match(name)):
                yield name, tensor
                continue
            shards = tensor.view(MP_NUM, 3, -1, tensor.shape[-1])
            for proj, index in (("q_proj", 0), ("v_proj", 1), ("k_proj", 2)):
                yield f"{match[1]}{proj}.weight", shards[:, index].reshape(-1, tensor.shape[-1])
