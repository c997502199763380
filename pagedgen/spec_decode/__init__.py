"""Speculative decoding by n-gram prompt lookup (vLLM's "ngram" method): drafts proposed from
the sequence's own tokens, verified in one step by the target model."""

from pagedgen.spec_decode.config import SpeculativeConfig
from pagedgen.spec_decode.ngram_proposer import NgramProposer

__all__ = ["NgramProposer", "SpeculativeConfig"]
