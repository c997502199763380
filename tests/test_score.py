"""LLM.score (vLLM's): an embedding model's cosine of each pair's embeddings, a one-label
cross-encoder's score of each pair as one prompt; 1 -> 1, 1 -> N and N -> N pairs."""

import pytest
import torch
import torch.nn.functional as F

from pagedgen import LLM
from tests.test_classification import logits, save_classifier
from tests.test_embeddings import quiet, reference, save_base_model


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("score-embed")
    model = save_base_model(folder, "llama")
    return LLM(str(folder), kv_cache_memory=0.01, log=quiet), model


def test_an_embedding_model_scores_by_cosine(embedder):
    llm, model = embedder
    query, docs = [5, 6, 7, 8], [[9, 10, 11], list(range(20, 45)), [5, 6, 7, 8]]
    outputs = llm.score(query, docs, use_tqdm=False)
    assert len(outputs) == 3
    for doc, output in zip(docs, outputs):
        a, b = reference(model, query, "LAST", True), reference(model, doc, "LAST", True)
        assert output.error is None
        assert output.outputs.score == pytest.approx(
            F.cosine_similarity(a, b, dim=0).item(), abs=1e-5
        )
        assert output.prompt_token_ids == query + doc
    assert outputs[2].outputs.score == pytest.approx(1.0, abs=1e-6)  # the query itself
    pairwise = llm.score([query, docs[1]], [docs[0], docs[2]], use_tqdm=False)
    assert pairwise[0].outputs.score == pytest.approx(outputs[0].outputs.score, abs=1e-6)
    with pytest.raises(ValueError, match="2 first texts for 3 second texts"):
        llm.score([query, docs[0]], docs)


def test_a_cross_encoder_scores_each_pair_as_one_prompt(tmp_path):
    """The byte-level test tokenizer joins a text and its pair with nothing between them."""
    model = save_classifier(tmp_path, "qwen2", num_labels=1)
    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=quiet)
    query, docs = "what is red?", ["a colour", "a number"]
    outputs = llm.score(query, docs, use_tqdm=False)
    for doc, output in zip(docs, outputs):
        ids = llm.tokenizer(query + doc)["input_ids"]
        assert output.prompt_token_ids == ids
        assert output.outputs.score == pytest.approx(
            torch.sigmoid(logits(model, ids)).item(), abs=1e-5
        )
    three = tmp_path / "three"
    save_classifier(three, "qwen2", num_labels=3)
    with pytest.raises(ValueError, match="one label"):
        LLM(str(three), kv_cache_memory=0.01, log=quiet).score(query, docs)
