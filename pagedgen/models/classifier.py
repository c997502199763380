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
    transformers' *ForSequenceClassification; the checkpoint's "score.weight" loads into it."""

    class ForSequenceClassification(base):  # type: ignore[valid-type, misc]
        def __init__(
            self, config: PretrainedConfig, backend: AttentionBackend, max_position: int
        ) -> None:
            super().__init__(config, backend, max_position)
            self.score = Linear(config.hidden_size, config.num_labels)

    name = base.__name__.replace("ForCausalLM", "ForSequenceClassification")
    ForSequenceClassification.__name__ = ForSequenceClassification.__qualname__ = name
    return ForSequenceClassification


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
