"""LLM.score (vLLM's): an embedding model's cosine of each pair's embeddings, a one-label
cross-encoder's score of each pair as one prompt; 1 -> 1, 1 -> N and N -> N pairs."""

import json

import pytest
import torch
import torch.nn.functional as F

from pagedgen import LLM
from tests.worker.pooler.test_classify import logits, save_classifier
from tests.worker.pooler.test_embed import quiet, reference, save_base_model


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


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "lm_head"])
def causal_lm(request, tmp_path_factory):
    """A tiny Qwen3 causal LM, its LM head tied to its embedding as Qwen3-Reranker-0.6B's (the
    checkpoint holds no lm_head tensor), or its own."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.conftest import build_tokenizer
    from tests.models.test_models import COMMON, CONFIGS

    folder = tmp_path_factory.mktemp("reranker")
    tied = {"tie_word_embeddings": request.param}
    config = AutoConfig.for_model(**(COMMON | CONFIGS["qwen3"] | tied))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder, model


def test_a_causal_lm_scores_as_the_two_way_softmax_of_its_tokens(causal_lm):
    """Qwen3-Reranker served as vLLM serves it: hf_overrides naming a classifier and the
    tokens ["no", "yes"] (here the byte tokens "n", "y"); a pair's score is the probability of
    "y" in the softmax over the two tokens' logits at the prompt's last position."""
    folder, model = causal_lm
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": ["n", "y"],
    }
    llm = LLM(str(folder), runner="pooling", hf_overrides=overrides, kv_cache_memory=0.01)
    no, yes = llm.tokenizer.convert_tokens_to_ids(["n", "y"])
    query, docs = "is red a colour?", ["yes it is", "no, a number"]
    for doc, output in zip(docs, llm.score(query, docs, use_tqdm=False)):
        assert output.prompt_token_ids == llm.tokenizer(query + doc)["input_ids"]
        with torch.no_grad():
            last = model(torch.tensor([output.prompt_token_ids])).logits[0, -1]
        expected = torch.softmax(last[[no, yes]], dim=0)[1].item()
        assert output.outputs.score == pytest.approx(expected, abs=1e-5)


def test_other_token_counts_classify_by_their_logits(causal_lm):
    folder, model = causal_lm
    tokens = ["a", "b", "c"]
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": tokens,
    }
    llm = LLM(str(folder), hf_overrides=overrides, kv_cache_memory=0.01)  # runner auto: classify
    ids = llm.tokenizer.convert_tokens_to_ids(tokens)
    prompts = [[5, 9, 200, 31], list(range(40, 90))]
    for prompt, output in zip(prompts, llm.classify(prompts, use_tqdm=False)):
        with torch.no_grad():
            last = model(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(
            torch.tensor(output.outputs.probs), torch.softmax(last[ids], dim=0), atol=1e-5, rtol=0
        )
    with pytest.raises(ValueError, match="no tokens of the vocabulary"):
        LLM(str(folder), hf_overrides={**overrides, "classifier_from_token": ["abc"]})


def test_a_run_reads_the_overrides_before_the_model_loads(causal_lm, tmp_path, capsys):
    """`pagedgen run --hf-overrides`: the job is a classification (probs written, sampling
    options refused) because the overrides name a classifier, though config.json names an LM."""
    from tests.cli_util import read_records, run_in_process, write_jsonl

    folder, model = causal_lm
    overrides = json.dumps(
        {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["n", "y"]}
    )
    src, out = write_jsonl(tmp_path / "in.jsonl", [{"prompt": [5, 6, 7]}]), tmp_path / "o.jsonl"
    args = ["run", str(src), "-o", str(out), "-m", str(folder), "--hf-overrides", overrides]
    code, _, err = run_in_process(capsys, *args, "--no-progress", "--kv-cache-memory", "0.01")
    assert code == 0, err
    assert "task classify" in err
    (record,) = read_records(out)
    with torch.no_grad():
        last = model(torch.tensor([[5, 6, 7]])).logits[0, -1]
    from transformers import AutoTokenizer

    no, yes = AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(["n", "y"])
    expected = torch.sigmoid(last[yes] - last[no]).item()
    assert record["probs"] == pytest.approx([expected], abs=1e-5)
    code, _, err = run_in_process(capsys, *args, "--temperature", "0.5", "--no-progress")
    assert code == 2 and "this job pools" in err, err


@pytest.mark.parametrize(
    "name, classifier",
    [
        ("gpt_neox", "GPTNeoXForSequenceClassification"),  # its own head, named embed_out
        ("bloom", "BloomForSequenceClassification"),  # tied to word_embeddings
        ("gpt2", "GPT2ForSequenceClassification"),  # tied to wte
    ],
)
def test_token_scores_read_the_lm_head_whatever_the_checkpoint_names_it(tmp_path, name, classifier):
    """The score head comes from the LM head as loaded: a checkpoint naming its head or
    embedding otherwise than Llama's (GPT-NeoX's embed_out beside embed_in) scores by the
    head's rows, not the input embedding's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.conftest import build_tokenizer
    from tests.models.test_models import COMMON, CONFIGS

    config = AutoConfig.for_model(**(COMMON | CONFIGS[name]))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    tokens = ["a", "b", "c"]
    overrides = {"architectures": [classifier], "classifier_from_token": tokens}
    llm = LLM(str(tmp_path), hf_overrides=overrides, kv_cache_memory=0.01, log=lambda m: None)
    ids = llm.tokenizer.convert_tokens_to_ids(tokens)
    prompt = [5, 9, 200, 31, 7]
    output = llm.classify([prompt], use_tqdm=False)[0]
    with torch.no_grad():
        last = model(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(
        torch.tensor(output.outputs.probs), torch.softmax(last[ids], dim=0), atol=1e-5, rtol=0
    )
