"""Speculative decoding by n-gram prompt lookup (vLLM's "ngram" method): drafts proposed from
the sequence's own tokens (pagedgen.core.ngram_proposer), verified in one step by the target
model."""

from pagedgen.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
