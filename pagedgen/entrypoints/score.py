"""vLLM's LLM.score: a similarity score for each pair of texts, by an embedding model (the
cosine of the two embeddings) or by a one-label cross-encoder (the classifier's score of the
pair encoded as one prompt, as the tokenizer joins a text and its text_pair)."""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from pagedgen.outputs import (
    PoolingRequestOutput,
    RequestMetrics,
    ScoringOutput,
    ScoringRequestOutput,
)

Text = str | list[int]


def score_pairs(data_1: Text | list[Text], data_2: Text | list[Text]) -> list[tuple[Text, Text]]:
    """The pairs to score: 1 -> 1, 1 -> N (the one paired with each) or N -> N (in order)."""
    firsts, seconds = _texts(data_1), _texts(data_2)
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise ValueError(f"{len(firsts)} first texts for {len(seconds)} second texts")
    if not seconds:
        raise ValueError("no texts to score")
    return list(zip(firsts, seconds))


def score_by_embeddings(
    embed: Callable[[list[Text]], list[PoolingRequestOutput]], pairs: list[tuple[Text, Text]]
) -> list[ScoringRequestOutput]:
    """Each pair's cosine similarity, every distinct text embedded once."""
    texts = list(dict.fromkeys(_key(t) for pair in pairs for t in pair))
    outputs = dict(zip(texts, embed([_text(t) for t in texts])))
    results = []
    for i, (first, second) in enumerate(pairs):
        a, b = outputs[_key(first)], outputs[_key(second)]
        error = a.error or b.error
        score = 0.0
        if error is None:
            x, y = torch.tensor(a.outputs.embedding), torch.tensor(b.outputs.embedding)
            score = F.cosine_similarity(x, y, dim=0).item()
        results.append(_output(str(i), a.prompt_token_ids + b.prompt_token_ids, score, error, a))
    return results


def score_by_cross_encoder(
    classify: Callable[[list[list[int]]], list[PoolingRequestOutput]],
    tokenizer: Any,
    pairs: list[tuple[Text, Text]],
) -> list[ScoringRequestOutput]:
    """Each pair as one prompt (the tokenizer's text and text_pair), its one-label score."""
    prompts = [_pair_ids(tokenizer, first, second) for first, second in pairs]
    results = []
    for i, (prompt, output) in enumerate(zip(prompts, classify(prompts))):
        score = output.outputs.probs[0] if output.error is None else 0.0
        results.append(_output(str(i), prompt, score, output.error, output))
    return results


def _pair_ids(tokenizer: Any, first: Text, second: Text) -> list[int]:
    if isinstance(first, list) and isinstance(second, list):
        return first + second
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer: give texts to score as token ids")
    encoded = tokenizer(text=_decoded(tokenizer, first), text_pair=_decoded(tokenizer, second))
    return list(encoded["input_ids"])


def _decoded(tokenizer: Any, text: Text) -> str:
    return text if isinstance(text, str) else tokenizer.decode(text)


def _output(
    request_id: str, prompt_token_ids: list[int], score: float, error: str | None, source: Any
) -> ScoringRequestOutput:
    metrics = RequestMetrics(source.metrics.arrival_time, None, source.metrics.finished_time)
    return ScoringRequestOutput(
        request_id, None, prompt_token_ids, ScoringOutput(score), metrics, error
    )


def _texts(data: Text | list[Text]) -> list[Text]:
    if isinstance(data, str) or (data and isinstance(data, list) and isinstance(data[0], int)):
        return [data]
    return list(data)


def _key(text: Text) -> Text | tuple[int, ...]:
    return tuple(text) if isinstance(text, list) else text


def _text(key: Text | tuple[int, ...]) -> Text:
    return list(key) if isinstance(key, tuple) else key
