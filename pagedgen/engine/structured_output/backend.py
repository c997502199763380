"""llguidance behind the few calls the manager makes; imported only when a request asks for
structured output (the `structured` extra installs it)."""

import json
import os
from typing import Any

import torch

from pagedgen.engine.structured_output import INSTALL_HINT
from pagedgen.engine.structured_output.grammar import error_text
from pagedgen.sampling_params import StructuredOutputsParams

try:
    import llguidance
    import llguidance.hf
    import llguidance.numpy
except ImportError as e:
    raise ImportError(INSTALL_HINT) from e

# Compact JSON with json.dumps's separators: with free whitespace a small model may spend its
# whole budget on newlines, and a completion cut by max_tokens does not parse.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A constraint that cannot compile: a bad schema, regex or grammar."""


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of a constraint; raises GrammarError where it cannot be built."""
    kind, text = params.key
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
        if kind == "json_object":
            schema = '{"type": "object"}'
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        if kind == "choice":
            return llguidance.grammar_from("choice", json.loads(text))
        return llguidance.grammar_from(kind, text)  # "regex", or "grammar": Lark or GBNF
    except ValueError as e:
        raise GrammarError(f"invalid {kind}: {e}") from e


def check_grammar(params: StructuredOutputsParams) -> None:
    """Raises GrammarError for a constraint that does not compile, with any tokenizer."""
    error = llguidance.LLMatcher.validate_grammar(grammar_text(params))
    if error:
        raise GrammarError(f"invalid {params.key[0]}: {error.strip()}")


class GuidanceBackend:
    """The model's tokenizer as llguidance sees it (built once, about a second), compiled
    constraints, and the bitmask of a batch of matchers."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: set[int]) -> None:
        try:
            self.tokenizer = llguidance.hf.from_tokenizer(
                tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_token_ids) or None
            )
        except ValueError as e:  # a slow (Python) tokenizer
            raise GrammarError(f"structured output needs a fast tokenizer: {e}") from e
        self.vocab_size = vocab_size
        # One thread per two cores: the model's own threads run beside it.
        self.executor = llguidance.LLExecutor(max(1, (os.cpu_count() or 2) // 2))

    def compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A matcher at the start of the constraint: every sequence's matcher copies it."""
        kind = params.key[0]
        matcher = llguidance.LLMatcher(self.tokenizer, grammar_text(params), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {kind}: {error_text(matcher)}")
        matcher.compute_bitmask()  # a grammar no token can start fails only here
        if matcher.is_error():
            raise GrammarError(
                f"no output can satisfy the {kind}: it allows no first token "
                f"({error_text(matcher)})"
            )
        return matcher

    def fill_bitmask(self, matchers: list[llguidance.LLMatcher]) -> tuple[torch.Tensor, list[int]]:
        """The next-token bitmask of each matcher, [len(matchers), ceil(vocab_size / 32)] int32,
        and the rows that allow no token at all (a dead end), which are set to allow every token
        so that sampling stays defined while the engine ends those sequences."""
        bitmask = torch.empty((len(matchers), (self.vocab_size + 31) // 32), dtype=torch.int32)
        llguidance.numpy.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask.numpy()
        )
        empty_rows = (~bitmask.any(dim=1)).nonzero().flatten().tolist()
        bitmask[empty_rows] = -1
        return bitmask, empty_rows
