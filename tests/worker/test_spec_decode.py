"""Speculative decoding through real models on the CPU: every output (tokens, text, logprobs,
finish reasons) equals the engine's without drafts, for greedy and seeded random sampling and
everything that edits logits per position, with CPU graphs and eagerly, through preemption."""

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from pagedgen import LLM, BeamSearchParams, SamplingParams
from pagedgen.sampling_params import StructuredOutputsParams
from pagedgen.worker.step_inputs import StepArrays
from tests.cli_util import read_records, run_in_process, tiny, write_jsonl

ENGINE = dict(device="cpu", dtype="float32", attention_backend="cpu", log=lambda m: None)
SPEC = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}


def repetitive_prompts(seed: int, num_prompts: int) -> list[list[int]]:
    """Prompts that repeat a phrase, as the text a summary or an edit quotes from."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        phrase = [rng.randrange(256) for _ in range(rng.randint(2, 6))]
        prompts.append([rng.randrange(256) for _ in range(rng.randint(0, 8))] + phrase * 4)
    return prompts


def outputs(llm: LLM, prompts, params) -> list[tuple]:
    return [
        tuple(
            (c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs, c.cumulative_logprob)
            for c in out.outputs
        )
        for out in llm.generate(prompts, params, use_tqdm=False)
    ]


class OracleProposer:
    """Drafts the tokens the engine without drafts generated (a random model rarely repeats
    itself, so n-gram drafts of its outputs are mostly wrong), one of them made wrong in a
    third of the proposals: most drafts are accepted, and rejections come at every offset."""

    def __init__(self, plain: list[tuple], prompts, params, k: int) -> None:
        self.k, self.rng = k, random.Random(0)
        self.reference = {}
        for prompt, p, out in zip(prompts, params, plain):
            for i, completion in enumerate(out):
                seed = None if p.seed is None else p.seed + i
                self.reference[(tuple(prompt), seed)] = completion[0]

    def num_drafts_at(self, batch_size: int) -> int:
        return self.k

    def propose_for(self, seq, max_model_len: int, k: int) -> list[int]:
        key = (tuple(seq.prompt_token_ids), seq.sampling_params.seed)
        start = seq.num_output_tokens
        room = min(max_model_len - seq.num_tokens, seq.sampling_params.max_tokens - start - 1)
        drafts = list(self.reference[key][start : start + min(k, room)])
        if drafts and self.rng.random() < 1 / 3:
            i = self.rng.randrange(len(drafts))
            drafts[i] = (drafts[i] + 1) % 256
        return drafts


def both(
    path, prompts, params, oracle: bool = False, engine=ENGINE, **kwargs
) -> tuple[list, list, LLM]:
    plain = outputs(LLM(str(path), **engine, **kwargs), prompts, params)
    llm = LLM(str(path), **engine, speculative_config=SPEC, **kwargs)
    if oracle:
        llm.engine.output_processor.proposer = OracleProposer(plain, prompts, params, k=4)
    result = outputs(llm, prompts, params)
    llm.engine.block_manager.check_integrity()
    assert not llm.engine.block_manager.seqs, "a finished sequence holds blocks"
    return plain, result, llm


def assert_drafts_checked(llm: LLM, num_accepted: int) -> None:
    """The run verified drafts, and turned some down: both paths of verification ran."""
    stats = llm.engine.stats.spec_decode
    assert stats.num_accepted_tokens >= num_accepted, stats
    assert stats.num_accepted_tokens < stats.num_draft_tokens, stats


@pytest.mark.slow
@pytest.mark.parametrize("oracle", [False, True])
@pytest.mark.parametrize(("block_size", "enforce_eager"), [(4, False), (16, False), (16, True)])
def test_greedy_outputs_equal(tiny_llama_path, block_size, enforce_eager, oracle):
    prompts = repetitive_prompts(block_size, 16)
    rng = random.Random(1)
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(1, 40), ignore_eos=i % 2 == 0)
        for i in range(len(prompts))
    ]
    kwargs = dict(block_size=block_size, enforce_eager=enforce_eager)
    with counting_graph_steps() as graph_steps:
        plain, result, llm = both(tiny_llama_path, prompts, params, oracle, **kwargs)
    assert result == plain
    assert_drafts_checked(llm, 100 if oracle else 3)
    # with graphs, the steps verifying drafts replay them, their drafts as decode rows
    assert (sum(graph_steps) >= 5) != enforce_eager, sum(graph_steps)


@contextmanager
def counting_graph_steps() -> Iterator[list[bool]]:
    """Whether each graph replay computed drafts (more tokens than sequences)."""
    graph_steps = []
    decode_rows = StepArrays.decode_rows

    def spy(arrays):
        graph_steps.append(len(arrays.input_ids) > len(arrays.rows))
        return decode_rows(arrays)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StepArrays, "decode_rows", spy)
        yield graph_steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_verify_drafts(head64_llama_path):
    """On a GPU, decode CUDA graphs replay the steps with drafts, outputs unchanged (heads of
    64: CUDA graphs need the cupy decode kernels)."""
    prompts = repetitive_prompts(5, 8)
    params = [SamplingParams(temperature=0, max_tokens=32, ignore_eos=True) for _ in prompts]
    engine = dict(device="cuda", dtype="float32", kv_cache_memory=0.01, log=lambda m: None)
    with counting_graph_steps() as graph_steps:
        plain, result, llm = both(head64_llama_path, prompts, params, True, engine)
    assert result == plain
    assert_drafts_checked(llm, 50)
    assert sum(graph_steps) >= 5, graph_steps


@pytest.mark.parametrize("oracle", [False, True])
def test_seeded_sampling_and_logit_edits_equal(tiny_llama_path, oracle):
    """Each draft's row samples with the seed, penalties and bans of its own position."""
    prompts = repetitive_prompts(2, 12)
    params = [
        SamplingParams(temperature=0.5, top_p=0.95, top_k=20, seed=7 + i, n=1 + i % 2,
                       max_tokens=30, logprobs=2 if i % 2 else None, min_tokens=8 * (i % 3 == 0),
                       repetition_penalty=1.2 if i % 4 == 1 else 1.0,
                       frequency_penalty=0.5 if i % 4 == 2 else 0.0,
                       bad_words=["ab"] if i % 5 == 0 else None,
                       stop=["e"] if i % 5 == 2 else None, stop_token_ids=[65] if i == 3 else None)
        for i in range(len(prompts))
    ]  # fmt: skip
    plain, result, llm = both(tiny_llama_path, prompts, params, oracle)
    assert result == plain
    assert_drafts_checked(llm, 100 if oracle else 3)


def test_beam_search_and_prompt_logprobs_on_a_drafting_engine(tiny_llama_path):
    """Beam search never drafts; a request with prompt logprobs drafts after its prompt."""
    prompts = repetitive_prompts(6, 4)
    beam = BeamSearchParams(beam_width=3, max_tokens=12)
    plain = LLM(str(tiny_llama_path), **ENGINE)
    llm = LLM(str(tiny_llama_path), **ENGINE, speculative_config=SPEC)
    results = [
        [
            (c.token_ids, c.cumulative_logprob)
            for o in engine.beam_search(prompts, beam, use_tqdm=False)
            for c in o.outputs
        ]
        for engine in (plain, llm)
    ]
    assert results[1] == results[0]
    assert llm.engine.stats.spec_decode.num_drafts == 0
    params = SamplingParams(temperature=0, max_tokens=30, prompt_logprobs=2, logprobs=1)
    first, second = (
        [
            (o.prompt_logprobs, o.outputs[0].token_ids, o.outputs[0].logprobs)
            for o in engine.generate(prompts, params, use_tqdm=False)
        ]
        for engine in (plain, llm)
    )
    assert second == first
    assert llm.engine.stats.spec_decode.num_drafts > 0


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_preemption_and_prefix_hits_equal(tiny_llama_path, preemption_mode):
    prompts = [[5, 6, 7, 8] * 6 + p for p in repetitive_prompts(3, 12)]  # a shared prefix
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, n=2 if i % 3 == 0 else 1)
        for i in range(len(prompts))
    ]
    kwargs = dict(
        block_size=4,
        kv_cache_memory=0.00015,
        preemption_mode=preemption_mode,
        swap_space=0.01,
        max_num_batched_tokens=48,
    )
    plain, result, llm = both(tiny_llama_path, prompts, params, oracle=True, **kwargs)
    assert result == plain
    assert llm.engine.stats.num_preemptions > 0
    assert llm.engine.stats.num_prefix_cache_hits > 0
    assert_drafts_checked(llm, 100)


def test_structured_output_rows_beside_drafting_rows(tiny_llama_path):
    """A grammar's row keeps its mask when rows of drafts come before it in the step."""
    prompts = repetitive_prompts(4, 6)
    regex = SamplingParams(
        temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(regex="(ab|cd)+")
    )
    params = [
        regex if i % 3 == 2 else SamplingParams(temperature=0, max_tokens=30) for i in range(6)
    ]
    plain, result, llm = both(tiny_llama_path, prompts, params)
    assert result == plain
    for i in (2, 5):
        text = result[i][0][1]
        assert text and set(text) <= set("abcd"), text
    assert llm.engine.stats.spec_decode.num_accepted_tokens > 0


def test_cli_run_with_speculative_config(tiny_llama_path, tmp_path, capsys):
    """`pagedgen run --speculative-config JSON` writes the records a run without drafts writes,
    and its summary counts the drafts."""
    lines = [{"prompt": "abcabcabcabc" * (1 + i % 3), "id": str(i)} for i in range(6)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}'
    records = {}
    for name, extra in (("plain", []), ("spec", ["--speculative-config", spec])):
        out, stats = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
        args = [*tiny(tiny_llama_path, max_tokens=24), "--stats-json", str(stats), *extra]
        code, _, stderr = run_in_process(capsys, "run", str(src), "-o", str(out), *args)
        assert code == 0, stderr
        records[name] = [(r["id"], r["text"], r["completion_tokens"]) for r in read_records(out)]
    assert records["spec"] == records["plain"]
    summary = json.loads(stats.read_text())
    assert summary["spec_decode"]["num_draft_tokens"] > 0, summary
    assert "spec_decode" not in json.loads((tmp_path / "plain.json").read_text())
