"""Sequence classification checkpoints (LlamaForSequenceClassification, ...: classifiers and
reward models): the decoder and transformers' score head, run by the pooling runner."""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from pagedgen.attention import AttentionBackend
from pagedgen.layers.linear import Linear
from pagedgen.models.llama import LlamaForCausalLM

# torch.nn modules a sentence-transformers cross-encoder may name as its activation, as vLLM
# takes them: only these, by name (vLLM refuses anything outside torch.nn.modules).
_NAMED_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Sigmoid": "classify",
    "torch.nn.modules.activation.Softmax": "classify",
}


def for_sequence_classification(base: type[LlamaForCausalLM]) -> type[LlamaForCausalLM]:
    """base with a score head: num_labels logits from the pooled hidden state, no bias, as
    transformers' *ForSequenceClassification; the checkpoint's "score.weight" loads into it, or,
    for a causal LM read as a classifier (classifier_tokens), rows of its LM head."""

    class ForSequenceClassification(base):  # type: ignore[valid-type, misc]
        def __init__(
            self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
        ) -> None:
            super().__init__(config, backend, max_position)
            self.score = Linear(config.hidden_size, config.num_labels)

        def derived_weights(self) -> set[str]:
            """A causal LM read as a classifier: the score head from its LM head as loaded
            (tied or not, whatever the checkpoint names it)."""
            token_ids = getattr(self.config, "classifier_token_ids", None)
            if token_ids is None:
                return super().derived_weights()
            rows = score_rows(self.lm_head.weight.data, token_ids)
            self.score.load_shard("weight", rows.to(self.score.weight.dtype), None)
            return super().derived_weights() | {"score.weight"}

    name = base.__name__.replace("ForCausalLM", "ForSequenceClassification")
    ForSequenceClassification.__name__ = ForSequenceClassification.__qualname__ = name
    return ForSequenceClassification


def score_rows(lm_head: torch.Tensor, token_ids: list[int]) -> torch.Tensor:
    """A score head of the LM head's rows for token_ids: two of them [false, true] give one row,
    true's minus false's (in float32, as vLLM's from-2-way-softmax loader), any other number the
    rows themselves."""
    rows = lm_head[token_ids]
    if len(token_ids) == 2:
        rows = (rows[1:].float() - rows[:1].float()).to(rows.dtype)
    return rows


def classifier_tokens(hf_config: Any, tokenizer: Any) -> None:
    """vLLM's classifier_from_token (an hf_overrides field): a causal LM served as a
    classifier whose score head is its LM head's rows for those tokens, their ids set as
    hf_config.classifier_token_ids. Two tokens [false, true] make one label whose sigmoid is
    the two-way softmax's probability of true (how Qwen3-Reranker scores "yes" against "no",
    which is_original_qwen3_reranker implies); any other number, one label each."""
    tokens = getattr(hf_config, "classifier_from_token", None)
    if tokens is None and getattr(hf_config, "is_original_qwen3_reranker", False):
        tokens = ["no", "yes"]
    if not tokens:
        return
    ids = [tokenizer.convert_tokens_to_ids(token) for token in tokens]
    unknown = [t for t, i in zip(tokens, ids) if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise ValueError(f"classifier_from_token: {unknown} are no tokens of the vocabulary")
    hf_config.classifier_token_ids = ids
    hf_config.num_labels = 1 if len(ids) == 2 else len(ids)


def classifier_activation(hf_config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """What turns the logits into the scores a classification returns, as vLLM (and
    transformers' losses) read the config: problem_type regression keeps them, multi-label
    takes each one's sigmoid, and otherwise one label is a sigmoid and several a softmax; a
    sentence-transformers cross-encoder's own activation (Identity, Sigmoid, Softmax) first."""
    problem_type = getattr(hf_config, "problem_type", None) or ""
    kind = {"regression": "identity", "multi_label_classification": "sigmoid"}.get(problem_type)
    if kind is None and problem_type != "single_label_classification":
        named = (getattr(hf_config, "sentence_transformers", None) or {}).get("activation_fn")
        named = named or getattr(hf_config, "sbert_ce_default_activation_function", None)
        if named is not None and named not in _NAMED_ACTIVATIONS:
            raise ValueError(f"unsupported classifier activation {named!r}")
        kind = _NAMED_ACTIVATIONS.get(named)
    if kind == "identity":
        return lambda logits: logits
    if kind == "sigmoid" or getattr(hf_config, "num_labels", 0) < 2:
        return torch.sigmoid
    return lambda logits: F.softmax(logits, dim=-1)
