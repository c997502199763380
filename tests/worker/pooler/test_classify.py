"""Sequence classifiers and reward models (vLLM's LLM.classify): transformers'
*ForSequenceClassification logits on the same random-weight checkpoints, through the pooling
runner, with the activation vLLM picks from the config; and `pagedgen run` writing them."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from pagedgen import LLM, PoolingParams
from tests.cli_util import read_records, run_in_process, write_jsonl
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS
from tests.worker.pooler.test_embed import PROMPTS, quiet

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt_neox", "stablelm"]
ARCHITECTURES += ["gpt2"]  # GPT2ForSequenceClassification: DialogRPT, sentiment heads
ARCHITECTURES += ["bloom", "mpt", "falcon-rw"]  # ALiBi


def save_classifier(folder, name: str, **overrides):
    kwargs = dict(COMMON, pad_token_id=0) | CONFIGS[name] | {"num_labels": 3} | overrides
    config = AutoConfig.for_model(**kwargs)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return model


def logits(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0]


def assert_scores(model, outputs, prompts, activation=lambda x: x):
    for prompt, output in zip(prompts, outputs):
        assert output.error is None
        got = torch.tensor(output.outputs.probs)
        expected = activation(logits(model, prompt))
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def classifier(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"{request.param}-cls")
    return folder, save_classifier(folder, request.param)


def test_classify_matches_transformers(classifier):
    """runner "auto" pools with a classifier: LAST pooling, score head, softmax over 3 labels;
    use_activation=False gives the logits themselves."""
    folder, model = classifier
    llm = LLM(
        str(folder), kv_cache_memory=0.01, max_num_batched_tokens=16, max_num_seqs=4, log=quiet
    )
    assert llm.engine.pooler_config.task == "classify"
    outputs = llm.classify(PROMPTS, use_tqdm=False)
    assert_scores(model, outputs, PROMPTS, lambda x: x.softmax(-1))
    assert all(out.outputs.num_classes == 3 for out in outputs)
    raw = llm.classify(PROMPTS, PoolingParams(use_activation=False), use_tqdm=False)
    assert_scores(model, raw, PROMPTS)


@pytest.mark.parametrize(
    "overrides, activation",
    [
        ({"num_labels": 1}, torch.sigmoid),  # a reward model's one score
        ({"problem_type": "regression", "num_labels": 1}, lambda x: x),
        ({"problem_type": "multi_label_classification"}, torch.sigmoid),
        ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, lambda x: x),
    ],
)
def test_the_config_picks_the_activation(tmp_path, overrides, activation):
    model = save_classifier(tmp_path, "llama", **overrides)
    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=quiet)
    assert_scores(model, llm.classify(PROMPTS, use_tqdm=False), PROMPTS, activation)


def test_classify_and_embed_are_each_their_models_task(tmp_path, tiny_llama_path):
    save_classifier(tmp_path, "llama")
    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=quiet)
    with pytest.raises(ValueError, match="pooling task is classify: use LLM.classify"):
        llm.embed(PROMPTS)
    (out,) = llm.classify(PROMPTS[:1], PoolingParams(dimensions=2), use_tqdm=False)
    assert out.error == "dimensions are for embeddings, not classification"
    embedder = LLM(str(tiny_llama_path), runner="pooling", kv_cache_memory=0.01, log=quiet)
    with pytest.raises(ValueError, match="pooling task is embed: use LLM.embed"):
        embedder.classify(PROMPTS)
    generator = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=quiet)
    with pytest.raises(ValueError, match="LLM.classify needs an LLM built with runner='pooling'"):
        generator.classify(PROMPTS)


def test_a_run_writes_each_lines_scores(tmp_path, capsys):
    model = save_classifier(tmp_path / "model", "qwen3", num_labels=2)
    rows = [
        {"id": "a", "prompt": [5, 6, 7]},
        {"prompt": list(range(30)), "use_activation": False},
        {"prompt": [1, 2], "max_tokens": 3},
        {"custom_id": "x", "url": "/v1/embeddings", "body": {"input": "hi"}},
    ]
    src, out = write_jsonl(tmp_path / "in.jsonl", rows[:3]), tmp_path / "out.jsonl"
    args = ["run", str(src), "-o", str(out), "-m", str(tmp_path / "model"), "--no-progress"]
    code, _, err = run_in_process(capsys, *args, "--kv-cache-memory", "0.01")
    assert code == 1, err
    assert "runner pooling, task classify: LAST pooling, use_activation=True" in err
    scored, raw, bad = read_records(out)
    torch.testing.assert_close(
        torch.tensor(scored["probs"]), logits(model, [5, 6, 7]).softmax(-1), atol=2e-5, rtol=1e-4
    )
    torch.testing.assert_close(
        torch.tensor(raw["probs"]), logits(model, list(range(30))), atol=2e-5, rtol=1e-4
    )
    assert bad["probs"] is None
    assert bad["error"] == "line 3: 'max_tokens' is a sampling field; this job pools (classify)"
    src = write_jsonl(tmp_path / "openai.jsonl", rows[3:])
    code, stdout, err = run_in_process(
        capsys, "run", str(src), "-o", "-", "-m", str(tmp_path / "model"), "--no-progress"
    )
    assert code == 1, err
    assert "takes pagedgen's lines, not OpenAI's" in json.loads(stdout)["error"]["message"]
