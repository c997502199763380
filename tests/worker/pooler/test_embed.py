"""Embeddings (vLLM's pooling runner): LLM.embed against transformers' last_hidden_state of the
same random-weight checkpoints, pooled and normalized by hand, through chunked prefill, prefix
hits, a recomputed prompt and both CPU attention backends."""

import gc
import itertools
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel

from pagedgen import LLM, PoolingParams, SamplingParams
from pagedgen.core.scheduler_output import SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.pooling.config import PoolerConfig, resolve_pooler_config
from pagedgen.worker.model_runner import ModelRunner
from pagedgen.worker.pooler import Pooler
from tests.conftest import build_tokenizer
from tests.models.test_models import COMMON, CONFIGS

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "granite"]
PROMPTS = [list(range(1, 40)), [5, 6, 7], list(range(100, 200)), [9], [3, 1, 4, 1, 5, 9, 2, 6]]


def quiet(message: str) -> None:
    pass


def save_base_model(folder, name: str, **overrides):
    """A random-weight decoder without its LM head (LlamaModel, ...), as embedding models ship."""
    config = AutoConfig.for_model(**dict(COMMON, **CONFIGS[name], **overrides))
    torch.manual_seed(0)
    model = AutoModel.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return model


def reference(model, prompt: list[int], pooling_type: str, use_activation: bool) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor([prompt])).last_hidden_state[0]
    pooled = {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[pooling_type]
    return F.normalize(pooled, dim=0) if use_activation else pooled


def assert_embeds(model, outputs, prompts, pooling_type="LAST", use_activation=True, atol=2e-5):
    for prompt, output in zip(prompts, outputs):
        assert output.error is None
        assert output.prompt_token_ids == prompt
        got = torch.tensor(output.outputs.embedding)
        torch.testing.assert_close(
            got, reference(model, prompt, pooling_type, use_activation), atol=atol, rtol=1e-4
        )


@pytest.fixture(scope="module", params=ARCHITECTURES)
def base_model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"{request.param}-base")
    return folder, save_base_model(folder, request.param)


@pytest.fixture(scope="module")
def llama_base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-base")
    return folder, save_base_model(folder, "llama")


def test_a_checkpoint_without_lm_head_embeds_its_last_token(base_model):
    """runner "auto" embeds with LlamaModel, Qwen3Model, ...: LAST pooling, normalized."""
    folder, model = base_model
    llm = LLM(str(folder), kv_cache_memory=0.01, log=quiet)
    assert llm.engine.pooler_config == PoolerConfig("LAST", True)
    assert llm.engine.runner.model.lm_head is None  # pooling needs no logits
    outputs = llm.embed(PROMPTS, use_tqdm=False)
    assert_embeds(model, outputs, PROMPTS)
    assert all(out.outputs.hidden_size == COMMON["hidden_size"] for out in outputs)


@pytest.mark.parametrize("attention_backend", ["cpu", "torch"])
@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
@pytest.mark.parametrize("use_activation", [True, False])
def test_pooling_types_through_chunked_prefill(
    llama_base, pooling_type, use_activation, attention_backend
):
    """Prompts of up to 100 tokens in chunks of 16: MEAN sums across the chunks, CLS keeps the
    first; the same vectors as one pass."""
    folder, model = llama_base
    llm = LLM(
        str(folder),
        kv_cache_memory=0.01,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        attention_backend=attention_backend,
        pooler_config={"pooling_type": pooling_type.lower(), "use_activation": use_activation},
        log=quiet,
    )
    assert_embeds(model, llm.embed(PROMPTS, use_tqdm=False), PROMPTS, pooling_type, use_activation)
    assert llm.engine.stats.num_steps >= 151 // 16


def test_last_pooling_reuses_cached_prefixes_and_mean_does_not(llama_base):
    folder, model = llama_base
    prompts = [list(range(1, 60)), list(range(1, 60)) + [7, 8]]
    llm = LLM(str(folder), kv_cache_memory=0.01, block_size=8, log=quiet)
    first = llm.embed(prompts[:1], use_tqdm=False)
    again = llm.embed(prompts, use_tqdm=False)
    assert first[0].num_cached_tokens == 0
    assert [out.num_cached_tokens for out in again] == [56, 56]
    assert again[0].outputs.embedding == first[0].outputs.embedding
    assert_embeds(model, again, prompts)
    mean_config = {"pooling_type": "MEAN"}
    mean = LLM(
        str(folder), kv_cache_memory=0.01, block_size=8, pooler_config=mean_config, log=quiet
    )
    mean.embed(prompts[:1], use_tqdm=False)
    again = mean.embed(prompts, use_tqdm=False)
    assert [out.num_cached_tokens for out in again] == [0, 0]
    assert_embeds(model, again, prompts, "MEAN")


@pytest.mark.parametrize("pooling_type", ["MEAN", "CLS"])
def test_the_pooler_restarts_a_recomputed_prompt_and_forgets_dropped_ones(pooling_type):
    """A preemption by recompute computes the prompt again from position 0: what the first
    attempt summed is dropped. A sequence gone unfinished (aborted) leaves nothing behind: the
    runner frees its sum when the sequence dies."""
    pooler = Pooler(PoolerConfig(pooling_type, use_activation=False))
    runner = SimpleNamespace(pooler=pooler)
    seq, other = (Sequence(i, str(i), list(range(30)), SamplingParams()) for i in range(2))
    hidden = torch.randn(30, 8)

    def step(chunks, sample=()):
        rows = [hidden[start : start + n] + 100 * s.seq_id for s, start, n in chunks]
        last_rows = [r - 1 for r in itertools.accumulate(n for _, _, n in chunks)]
        seqs = [s for s, _, _ in chunks]
        starts, lengths = [c[1] for c in chunks], [c[2] for c in chunks]
        sample_rows = [seqs.index(s) for s in sample]
        scheduled = SchedulerOutput(
            seqs, starts, lengths, 0, list(sample), sample_rows, [], [], [], [], {}
        )
        return ModelRunner.pool(runner, torch.cat(rows), scheduled, last_rows)

    step([(seq, 0, 10), (other, 0, 5)])
    step([(seq, 10, 10)])
    step([(seq, 0, 10)])  # recomputed after a preemption
    (got,) = step([(seq, 10, 20)], [seq])
    expected = hidden.mean(0) if pooling_type == "MEAN" else hidden[0]
    torch.testing.assert_close(got, expected)
    assert len(pooler._partial) == 1  # other's
    del other
    gc.collect()
    assert len(pooler._partial) == 0


def test_sentence_transformers_files_set_the_pooling(tmp_path):
    """modules.json names a Pooling module (mean tokens) and no Normalize: MEAN, unnormalized;
    pooler_config still goes over it."""
    model = save_base_model(tmp_path, "qwen3")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}
    pooling |= {"pooling_mode_cls_token": False, "pooling_mode_lasttoken": False}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=quiet)
    assert llm.engine.pooler_config == PoolerConfig("MEAN", False)
    assert_embeds(model, llm.embed(PROMPTS, use_tqdm=False), PROMPTS, "MEAN", False)
    assert resolve_pooler_config(tmp_path, '{"use_activation": true}') == PoolerConfig("MEAN", True)
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "x.Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert resolve_pooler_config(tmp_path, None) == PoolerConfig("MEAN", True)
    pooling["pooling_mode_weightedmean_tokens"] = True
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(ValueError, match="weightedmean"):
        resolve_pooler_config(tmp_path, None)


def test_a_causal_lm_embeds_with_runner_pooling(tiny_llama_path):
    """A *ForCausalLM checkpoint generates unless runner="pooling" (Qwen3-Embedding's case);
    each runner refuses the other's calls."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).model
    llm = LLM(str(tiny_llama_path), kv_cache_memory=0.01, runner="pooling", log=quiet)
    assert_embeds(model, llm.embed(PROMPTS, use_tqdm=False), PROMPTS)
    with pytest.raises(ValueError, match="runner='pooling'"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))
    generator = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=quiet)
    assert generator.engine.pooler_config is None
    with pytest.raises(ValueError, match="runner='pooling'"):
        generator.embed(PROMPTS[:1])
    with pytest.raises(ValueError, match="need an engine built with runner=.pooling."):
        generator.engine.add_request("0", [1, 2], PoolingParams())


def test_matryoshka_dimensions_cut_before_normalizing(tmp_path):
    model = save_base_model(tmp_path, "llama", matryoshka_dimensions=[16, 32])
    llm = LLM(str(tmp_path), kv_cache_memory=0.01, log=quiet)
    params = [PoolingParams(dimensions=16), PoolingParams(dimensions=24), PoolingParams()]
    outputs = llm.embed(PROMPTS[:3], params, use_tqdm=False)
    cut = reference(model, PROMPTS[0], "LAST", False)[:16]
    torch.testing.assert_close(torch.tensor(outputs[0].outputs.embedding), F.normalize(cut, dim=0))
    assert outputs[1].error == "the model supports Matryoshka dimensions [16, 32] only"
    assert outputs[1].outputs.embedding == []
    assert outputs[2].error is None and outputs[2].outputs.hidden_size == 64
    raw = llm.embed(PROMPTS[0], PoolingParams(dimensions=32, use_activation=False), use_tqdm=False)
    torch.testing.assert_close(
        torch.tensor(raw[0].outputs.embedding), reference(model, PROMPTS[0], "LAST", False)[:32]
    )


def test_dimensions_need_a_matryoshka_model_and_prompts_must_fit(llama_base):
    folder, model = llama_base
    llm = LLM(str(folder), kv_cache_memory=0.01, max_model_len=64, log=quiet)
    out = llm.embed(PROMPTS[0], PoolingParams(dimensions=8), use_tqdm=False)[0]
    assert "does not support Matryoshka" in out.error
    fits, too_long, cut = llm.embed(
        [list(range(64)), list(range(65)), list(range(100))],
        [PoolingParams(), PoolingParams(), PoolingParams(truncate_prompt_tokens=10)],
        use_tqdm=False,
    )
    assert_embeds(model, [fits], [list(range(64))])
    assert too_long.error == "prompt (65 tokens) exceeds max_model_len (64)"
    assert_embeds(model, [cut], [list(range(90, 100))])


def test_bad_pooling_arguments_fail_before_loading():
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        LLM("no-such-model", pooler_config={"pooling_type": "MAX"})
    with pytest.raises(ValueError, match="unknown pooler_config keys"):
        LLM("no-such-model", pooler_config='{"pooling": "MEAN"}')
    with pytest.raises(ValueError, match="runner must be one of"):
        LLM("no-such-model", runner="embed")
    with pytest.raises(ValueError, match="speculative decoding"):
        spec = {"method": "ngram", "num_speculative_tokens": 2}
        LLM("no-such-model", runner="pooling", speculative_config=spec)
    with pytest.raises(ValueError, match="dimensions must be >= 1"):
        PoolingParams(dimensions=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_pooling_on_a_gpu(llama_base, pooling_type):
    """The CUDA kernels' prefill and the pooler on the device, chunked: transformers' states."""
    folder, model = llama_base
    llm = LLM(
        str(folder),
        device="cuda",
        dtype="float32",
        kv_cache_memory=0.01,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        pooler_config={"pooling_type": pooling_type},
        log=quiet,
    )
    outputs = llm.embed(PROMPTS, use_tqdm=False)
    assert_embeds(model, outputs, PROMPTS, pooling_type, atol=1e-4)


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "mistral"])
def test_windowed_base_models_embed_prompts_longer_than_their_window(tmp_path, name):
    """Gemma2Model, Gemma3TextModel and a sliding-window MistralModel: every layer's window
    (16 tokens) and soft cap, over prompts of up to 50 tokens, in chunks of 16."""
    from tests.models.test_sliding_window import COMMON as WINDOWED
    from tests.models.test_sliding_window import CONFIGS as WINDOWED_CONFIGS

    config = AutoConfig.for_model(**dict(WINDOWED, **WINDOWED_CONFIGS[name]))
    torch.manual_seed(0)
    model = AutoModel.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(tmp_path)
    build_tokenizer(tmp_path)
    prompts = [list(range(1, 51)), [7] * 23, [5, 9, 200]]
    llm = LLM(
        str(tmp_path), kv_cache_memory=0.01, max_num_batched_tokens=16, max_num_seqs=4, log=quiet
    )
    assert_embeds(model, llm.embed(prompts, use_tqdm=False), prompts)


def test_without_chunked_prefill_a_prompt_must_fit_one_step(llama_base):
    folder, model = llama_base
    llm = LLM(
        str(folder),
        kv_cache_memory=0.01,
        enable_chunked_prefill=False,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        log=quiet,
    )
    fits, too_long = llm.embed([list(range(32)), list(range(33))], use_tqdm=False)
    assert_embeds(model, [fits], [list(range(32))])
    assert too_long.error == (
        "33 tokens exceeds max_num_batched_tokens (32), the most one step can prefill"
    )


def test_a_bidirectional_encoder_is_refused(tmp_path):
    """An embedding model whose config says is_causal false attends both ways (gte-Qwen2):
    pagedgen's causal attention would embed it wrongly, so it refuses before loading weights."""
    save_base_model(tmp_path, "qwen2", is_causal=False)
    with pytest.raises(ValueError, match="bidirectionally"):
        LLM(str(tmp_path), kv_cache_memory=0.01, log=quiet)
