from dataclasses import dataclass, field
from typing import TypedDict

import torch


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """One layer's attention constants, given once when the layer is built (as vLLM's
    AttentionImpl.__init__ takes them): every backend call of the layer reads them from here.

    sinks and alibi_slopes are the layer's own tensors, held by reference (a sinks parameter is
    loaded in place after construction); they take no part in comparing or hashing a spec.
    """

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    sliding_window: int | None = None  # a query sees its last sliding_window tokens
    logits_soft_cap: float | None = None  # scores become cap * tanh(scores / cap)
    # [num_heads] float32: a logit in each head's softmax, a key of zero value (gpt-oss)
    sinks: torch.Tensor | None = field(default=None, compare=False)
    # [num_heads] float32: ALiBi, slope * (key position - query position) added to each score
    alibi_slopes: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {self.sliding_window}")
        for name in ("sinks", "alibi_slopes"):
            tensor = getattr(self, name)
            if tensor is not None and tuple(tensor.shape) != (self.num_heads,):
                raise ValueError(
                    f"{name} must have shape ({self.num_heads},), got {tuple(tensor.shape)}"
                )


class AttentionOptions(TypedDict):
    """A spec's options as the attention functions and kernels take them, by keyword."""

    window: int | None
    softcap: float | None
    sinks: torch.Tensor | None
    alibi_slopes: torch.Tensor | None


def spec_options(spec: AttentionSpec) -> AttentionOptions:
    return AttentionOptions(
        window=spec.sliding_window,
        softcap=spec.logits_soft_cap,
        sinks=spec.sinks,
        alibi_slopes=spec.alibi_slopes,
    )
