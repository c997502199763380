"""Speculative decoding's control plane, torch-free: the n-gram proposer, the config, and the
real engine loop verifying drafts with a scripted runner that keeps a shadow KV cache."""

import random

import pytest

from pagedgen.config import EngineConfig
from pagedgen.core.ngram_proposer import NgramProposer
from pagedgen.core.sequence import Sequence
from pagedgen.core.spec_verify import SpecDecodeStats, num_accepted
from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.sampling_params import SamplingParams
from pagedgen.spec_decode import SpeculativeConfig
from tests.core.kv_shadow import ShadowRunner, run_step

EOS = 0


def proposer(k=3, lo=1, hi=3) -> NgramProposer:
    return NgramProposer(
        SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=lo, prompt_lookup_max=hi)
    )


def test_proposer_takes_the_longest_ngram_at_its_latest_occurrence():
    p = proposer(k=3, lo=1, hi=3)
    # suffix [7, 8, 9] occurs once earlier (followed by 1, 2); the 1-gram [9] later (then 5)
    assert p.propose([7, 8, 9, 1, 2, 9, 5, 7, 8, 9], 10) == [1, 2, 9]
    assert p.propose([4, 9, 5, 6, 3, 9], 10) == [5, 6, 3]  # 1-gram only
    assert p.propose([9, 5, 3, 9, 6, 1, 9], 10) == [6, 1, 9]  # the latest of two
    assert p.propose([1, 2, 3, 4], 10) == []  # no earlier occurrence
    assert p.propose([5, 5], 10) == [5]  # the match may run into the suffix itself
    assert p.propose([7, 8, 9, 1, 2, 9, 5, 7, 8, 9], 2) == [1, 2]  # capped by the caller
    assert p.propose([7, 8, 9, 1, 2, 9, 5, 7, 8, 9], 0) == []
    assert proposer(lo=2, hi=3).propose([4, 9, 5, 6, 3, 9], 10) == []  # below prompt_lookup_min


def test_proposer_matches_whole_tokens_only():
    # As bytes, 0x00000100 followed by 0x00000001 contains 0x00010000 at an odd offset: the
    # byte search finds it, the proposer must not take it.
    p = proposer(k=2, lo=1, hi=1)
    assert p.propose([256, 1, 77, 65536], 10) == []
    assert p.propose([65536, 5, 256, 1, 77, 65536], 10) == [5, 256]


def test_proposer_against_brute_force():
    rng = random.Random(0)
    for _ in range(500):
        tokens = [rng.choice([1, 2, 3, 256, 65536, 2**31 - 1]) for _ in range(rng.randint(1, 30))]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 4)
        expected = []
        for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
            starts = [i for i in range(len(tokens) - n) if tokens[i : i + n] == tokens[-n:]]
            if starts:
                expected = tokens[starts[-1] + n : starts[-1] + n + 3]
                break
        assert proposer(k=3, lo=lo, hi=hi).propose(tokens, 10) == expected, (tokens, lo, hi)


def test_propose_for_respects_max_tokens_max_model_len_and_grammars():
    p = proposer(k=4, lo=1, hi=2)
    seq = Sequence(0, "r", [5, 6, 5, 6, 5, 6, 5], SamplingParams(max_tokens=3))
    assert p.propose_for(seq, 100) == [6, 5]  # 3 tokens left: 2 drafts and the bonus
    seq.append_token_id(6)
    assert p.propose_for(seq, 100) == [5]
    seq.sampling_params = SamplingParams(max_tokens=None)
    assert p.propose_for(seq, 10) == [5, 6]  # 8 tokens: positions up to 9 fit
    seq.sampling_params = SamplingParams(structured_outputs={"regex": "a+"})
    assert p.propose_for(seq, 100) == []


def test_config_parses_vllm_dicts():
    config = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    config = SpeculativeConfig.parse({"num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (3, 3)
    assert SpeculativeConfig.parse(None) is None
    config = SpeculativeConfig.parse('{"num_speculative_tokens": 2, "prompt_lookup_min": null}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    engine_config = EngineConfig(speculative_config={"num_speculative_tokens": 2})
    assert engine_config.speculative_config == SpeculativeConfig(num_speculative_tokens=2)
    bad = [
        {"method": "eagle", "num_speculative_tokens": 2},
        {"prompt_lookup_max": 3},
        {"num_speculative_tokens": 0},
        {"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 3},
        {"num_speculative_tokens": 2, "draft_model": "x"},
        {"num_speculative_tokens": "2"},
    ]
    for value in bad:
        with pytest.raises(ValueError):
            SpeculativeConfig.parse(value)
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(async_scheduling=True, speculative_config={"num_speculative_tokens": 2})


def test_num_accepted_and_stats():
    assert num_accepted([4, 5, 6], [4, 5, 7, 9]) == 2
    assert num_accepted([4, 5], [4, 5, 1]) == 2
    assert num_accepted([4, 5], [3, 5, 1]) == 0
    stats = SpecDecodeStats()
    stats.record(3, 2)
    stats.record(3, 0)
    assert stats.draft_acceptance_rate == 2 / 6 and stats.mean_acceptance_length == 2.0


def scripted_token(seq: Sequence) -> int:
    """A deterministic function of the tokens so far: mostly repeats (drafts get accepted),
    sometimes a new token (drafts get rejected), and EOS now and then."""
    t = seq.token_ids
    if len(t) % 29 == 0 and seq.request_id.endswith("3"):
        return EOS
    if len(t) % 7 == 0:
        return (sum(t[-3:]) * 31 + len(t)) % 97 + 1
    return t[-min(4, len(t))]


class ScriptedRunner(ShadowRunner):
    def __init__(self, block_size: int, num_blocks: int, num_cpu_blocks: int) -> None:
        super().__init__(block_size, num_blocks, num_cpu_blocks)
        self.next_token = scripted_token


def run(
    spec: dict | None, prompts, params, on_step=None, **kw
) -> tuple[dict[str, list[list[int]]], LLMEngine]:
    """Runs the requests to the end; on_step((num_seqs, drafted)) sees every step scheduled."""
    block_size, num_blocks, num_cpu_blocks = kw.pop("block_size", 4), kw.pop("num_blocks", 64), 32
    config = EngineConfig(model="unused", block_size=block_size, speculative_config=spec, **kw)
    runner = ScriptedRunner(block_size, num_blocks, num_cpu_blocks)
    engine = LLMEngine(config, runner, None, num_blocks, num_cpu_blocks, 200, {EOS})
    engine.block_manager.watermark_blocks = 0
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    outputs = {}
    while engine.has_unfinished_requests():
        num_steps = runner.num_steps
        for out in engine.step():
            outputs[out.request_id] = [c.token_ids for c in out.outputs]
        if on_step is not None and runner.num_steps > num_steps:
            on_step((len(runner.last.seqs), bool(runner.last.spec_token_ids)))
        engine.block_manager.check_integrity()
        for seq in engine.block_manager.seqs.values():  # no block past its tokens between steps
            assert len(seq.block_table) <= engine.block_manager.num_blocks_for(seq.num_tokens)
    return outputs, engine


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"max_num_batched_tokens": 9},  # drafts trimmed to the token budget
        {"num_blocks": 24, "preemption_mode": "recompute"},
        {"num_blocks": 24, "preemption_mode": "swap"},
        {"enable_prefix_caching": False, "block_size": 1},
        {"max_num_seqs": 3, "block_size": 16},
    ],
)
def test_outputs_equal_without_drafts_and_kv_reads_its_own_tokens(kw):
    rng = random.Random(1)
    shared = [rng.randint(1, 98) for _ in range(9)]
    prompts, params = [], []
    for i in range(10):
        prompt = (shared if i % 2 else []) + [rng.randint(1, 98) for _ in range(rng.randint(2, 12))]
        prompts.append(prompt)
        n = 2 if i % 4 == 1 else 1
        params.append(SamplingParams(max_tokens=rng.randint(5, 40), n=n, seed=i, detokenize=False))
    spec = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    expected, _ = run(None, prompts, params, **kw)
    got, engine = run(spec, prompts, params, **kw)
    assert got == expected
    stats = engine.stats.spec_decode
    assert stats.num_accepted_tokens > 20 and stats.num_accepted_tokens < stats.num_draft_tokens
    assert engine.stats.num_generation_tokens == sum(len(t) for ts in got.values() for t in ts)
    assert engine.stats.num_steps < run(None, prompts, params, **kw)[1].stats.num_steps
    if kw.get("num_blocks") == 24:
        assert engine.stats.num_preemptions


def test_drafts_go_into_one_step_and_rejected_ones_are_uncounted():
    spec = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    config = EngineConfig(model="unused", block_size=4, speculative_config=spec)
    runner = ShadowRunner(4, 16)  # samples 7 for everyone
    engine = LLMEngine(config, runner, None, 16, 0, 64, {EOS})
    engine.add_request("a", [7, 1, 2, 7, 3, 4], SamplingParams(max_tokens=10, detokenize=False))
    out = run_step(engine)  # prefill; samples 7, then drafts [3, 4, 7] after the 1-gram [7]
    seq = out.seqs[0]
    assert seq.spec_token_ids == [3, 4, 7]
    out = run_step(engine)
    assert out.num_new_tokens == [4] and out.spec_token_ids == {seq.seq_id: [3, 4, 7]}
    assert out.num_decode_seqs == 0 and out.num_prefill_tokens == 0
    # the runner sampled 7 at each row: 3 is rejected, 7 kept: one token, 3 drafts uncounted
    assert seq.output_token_ids == [7, 7] and seq.num_computed_tokens == 7
    assert len(seq.block_table) == 2  # the block the drafts reached into is back
    assert engine.stats.spec_decode.num_draft_tokens == 3
    assert engine.stats.spec_decode.num_accepted_tokens == 0
    assert seq.spec_token_ids == [7]  # after the latest earlier [7, 7]: the last 7
    run_step(engine)
    assert seq.output_token_ids == [7] * 4 and seq.num_computed_tokens == 9
    assert engine.stats.spec_decode.num_accepted_tokens == 1


def test_num_speculative_tokens_per_batch_size():
    """vLLM's dynamic schedule: inclusive ranges, gaps and the tail take the k before them."""
    config = SpeculativeConfig.parse(
        {
            "num_speculative_tokens": 4,
            "num_speculative_tokens_per_batch_size": [[1, 2, 6], [4, 8, 2], [9, 16, 0]],
        }
    )
    assert [config.num_drafts_at(b) for b in (1, 2, 3, 4, 8, 9, 16, 500)] == [
        4,
        4,
        4,
        2,
        2,
        0,
        0,
        0,
    ]
    assert SpeculativeConfig(num_speculative_tokens=3).num_drafts_at(1000) == 3
    for schedule in ([], [[2, 4, 1]], [[1, 4, 1], [4, 8, 1]], [[1, 4, -1]], [[1, 4]], [[1, 0, 2]]):
        with pytest.raises(ValueError, match="num_speculative_tokens_per_batch_size"):
            SpeculativeConfig(
                num_speculative_tokens=2, num_speculative_tokens_per_batch_size=schedule
            )


def test_large_batches_draft_nothing_under_a_schedule():
    spec = {
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 64, 0]],
    }
    prompts = [[5, 6, 5, 6, 5, 6, 5]] * 4
    params = [SamplingParams(max_tokens=20 + 10 * i, detokenize=False) for i in range(4)]
    drafted_at = []
    expected, _ = run(None, prompts, params, enable_prefix_caching=False)
    got, engine = run(spec, prompts, params, enable_prefix_caching=False, on_step=drafted_at.append)
    assert got == expected
    # 4, then 3 sequences: no drafts; 2 and then 1 left: drafts again
    batch_sizes = [n for n, drafted in drafted_at if drafted]
    assert batch_sizes and max(batch_sizes) <= 2, drafted_at
    assert engine.stats.spec_decode.num_accepted_tokens > 0


def test_drafts_leave_each_later_decode_its_token():
    """A tight token budget goes to every running decode's own token before any drafts."""
    spec = {"num_speculative_tokens": 3, "prompt_lookup_min": 1}
    config = EngineConfig(
        model="unused",
        block_size=4,
        speculative_config=spec,
        max_num_batched_tokens=6,
        max_num_seqs=3,
    )
    engine = LLMEngine(config, ShadowRunner(4, 32), None, 32, 0, 64, {EOS})
    for i in range(3):
        engine.add_request(str(i), [1 + i, 2 + i], SamplingParams(max_tokens=10, detokenize=False))
    run_step(engine)  # the three prompts
    seqs = [engine.requests[str(i)].group.seqs[0] for i in range(3)]
    for seq in seqs:
        seq.spec_token_ids = [7, 7, 7]
    out = run_step(engine)
    scheduled = {seq.seq_id: n for seq, n in zip(out.seqs, out.num_new_tokens)}
    assert [scheduled.get(seq.seq_id) for seq in seqs] == [4, 1, 1]  # 2 tokens reserved
    assert out.spec_token_ids == {seqs[0].seq_id: [7, 7, 7]}


def test_propose_for_keeps_each_sequences_bytes_in_step_with_its_tokens():
    p = proposer(k=3, lo=1, hi=3)
    rng = random.Random(2)
    seq = Sequence(0, "r", [rng.randrange(5) for _ in range(6)], SamplingParams(max_tokens=None))
    for step in range(200):
        expected = p.propose(seq.token_ids, 3)
        assert p.propose_for(seq, 10_000) == expected, step
        if step == 100:  # a fork grows apart from its parent, each with its own bytes
            child = seq.fork(1)
            child.append_token_id(4)
            assert p.propose_for(child, 10_000) == p.propose(child.token_ids, 3)
        seq.append_token_id(rng.randrange(5))
