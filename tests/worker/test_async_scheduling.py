"""Async scheduling (LLMEngine.step with async_scheduling): step N + 1 is scheduled and queued
before the host has step N's tokens, which reach it through placeholders filled on the device.
Proven on the CPU, where the same code runs: every output equals the one-step-at-a-time
engine's, through preemption, prefix hits, chunked prefill, parallel sampling, stops, aborts and
the requests that force synchronous steps."""

import random
import weakref

import numpy as np
import pytest
import torch

from pagedgen import LLM, SamplingParams
from pagedgen.core.sequence import PLACEHOLDER
from pagedgen.worker.graph_capture import capture_decode_graphs
from pagedgen.worker.model_runner import ModelRunner
from pagedgen.worker.placeholders import LastSamples

ENGINE = dict(device="cpu", dtype="float32", attention_backend="cpu", log=lambda m: None)


def prompts_of(seed: int, num_prompts: int, shared_prefix: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(shared_prefix)]
    return [
        prefix + [rng.randrange(256) for _ in range(rng.randint(1, 50))] for _ in range(num_prompts)
    ]


def outputs(llm: LLM, prompts, params) -> list[tuple]:
    return [
        tuple(
            (c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs, c.cumulative_logprob)
            for c in out.outputs
        )
        for out in llm.generate(prompts, params)
    ]


def count_placeholder_steps(llm: LLM) -> list[int]:
    """Counts the steps whose inputs held placeholders (and so overlapped the step before)."""
    runner, counted = llm.engine.runner, [0]
    runner_ref = weakref.ref(runner)  # a strong one would make a cycle

    def spy(*args):
        found = ModelRunner._find_placeholders(runner_ref(), *args)
        counted[0] += found is not None
        return found

    runner._find_placeholders = spy
    return counted


def both(path, prompts, params, **kwargs) -> tuple[list, list, LLM]:
    sync = outputs(LLM(str(path), **ENGINE, **kwargs), prompts, params)
    llm = LLM(str(path), **ENGINE, async_scheduling=True, **kwargs)
    overlapped = count_placeholder_steps(llm)
    result = outputs(llm, prompts, params)
    llm.engine.block_manager.check_integrity()
    assert llm.engine.in_flight is None
    assert not llm.engine.num_sync_requests
    llm.overlapped = overlapped[0]
    return sync, result, llm


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [4, 16])
def test_greedy_outputs_equal_one_step_at_a_time(tiny_llama_path, block_size):
    prompts = prompts_of(block_size, 24)
    rng = random.Random(1)
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(1, 30), ignore_eos=i % 2 == 0)
        for i in range(len(prompts))
    ]
    sync, result, llm = both(tiny_llama_path, prompts, params, block_size=block_size)
    assert result == sync
    assert llm.overlapped >= 20


def test_sampling_logprobs_stops_and_parallel_samples_equal(tiny_llama_path):
    """Seeded random rows, n > 1 forks, logprobs, min_tokens, stop strings and token ids."""
    prompts = prompts_of(2, 12)
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=7 + i, n=1 + i % 3,
                       max_tokens=20, logprobs=3 if i % 2 else None, min_tokens=i % 4,
                       stop=["e"] if i % 5 == 0 else None, stop_token_ids=[65] if i == 3 else None)
        for i in range(len(prompts))
    ]  # fmt: skip
    sync, result, llm = both(tiny_llama_path, prompts, params)
    assert result == sync
    assert llm.overlapped >= 10


def watch_preemptions(llm: LLM) -> dict[str, int]:
    """Counts the paths under test: groups preempted holding a placeholder, placeholders in
    prefill rows (a group recomputed in the step that preempted it), and sequences that
    finished while preempted (their last token was in flight)."""
    scheduler, runner = llm.engine.scheduler, llm.engine.runner
    seen = dict(preempted=0, prefill=0, finished_queued=0)
    preempt, remove, find = (
        scheduler._preempt,
        scheduler.remove_finished_groups,
        runner._find_placeholders,
    )

    def watched_preempt(group, step):
        seen["preempted"] += any(seq.num_output_placeholders for seq in group.unfinished_seqs)
        preempt(group, step)

    def watched_remove(queued=False):
        seen["finished_queued"] += queued
        remove(queued)

    def watched_find(input_ids, seqs, cu_seqlens_q):
        found = find(input_ids, seqs, cu_seqlens_q)
        if found is not None:
            owners = np.searchsorted(cu_seqlens_q, found[0], side="right") - 1
            seen["prefill"] += int((np.diff(cu_seqlens_q)[owners] > 1).sum())
        return found

    engine, step = llm.engine, llm.engine.step

    def checked_step():
        finished = step()
        queued = [*scheduler.waiting, *scheduler.swapped]
        assert not any(group.is_finished for group in queued), "a finished group is queued"
        return finished

    scheduler._preempt, scheduler.remove_finished_groups = watched_preempt, watched_remove
    runner._find_placeholders, engine.step = watched_find, checked_step
    return seen


@pytest.mark.parametrize(
    ("preemption_mode", "seed", "short"),
    [("recompute", 3, False), ("swap", 3, False), ("recompute", 5, True), ("swap", 1, True)],
)
def test_preemption_prefix_hits_and_chunked_prefill_equal(
    tiny_llama_path, preemption_mode, seed, short
):
    """A pool of a few blocks, a small token budget and shared prefixes: sequences are preempted
    while their last token is in flight, come back through waiting or swapped, and (short
    outputs) finish while preempted."""
    rng = random.Random(seed)
    prompts = prompts_of(seed, 12, shared_prefix=20)
    params = [
        SamplingParams(temperature=0, max_tokens=rng.choice([1, 1, 2, 30]) if short else 30,
                       ignore_eos=True, n=2 if i % 4 == 0 else 1)
        for i in range(len(prompts))
    ]  # fmt: skip
    kwargs = dict(block_size=4, preemption_mode=preemption_mode, swap_space=0.01,
                  kv_cache_memory=0.0001 if short else 0.00015,
                  max_num_batched_tokens=32 if short else 48)  # fmt: skip
    sync = outputs(LLM(str(tiny_llama_path), **ENGINE, **kwargs), prompts, params)
    llm = LLM(str(tiny_llama_path), **ENGINE, async_scheduling=True, **kwargs)
    seen = watch_preemptions(llm)
    assert outputs(llm, prompts, params) == sync
    llm.engine.block_manager.check_integrity()
    assert seen["preempted"] > 0
    if short:
        assert seen["finished_queued"] > 0
    elif preemption_mode == "recompute":
        assert seen["prefill"] > 0
    assert llm.engine.block_manager.num_prefix_cache_hits > 0


@pytest.mark.slow
def test_generated_blocks_reach_the_prefix_cache_as_one_step_at_a_time(tiny_llama_path):
    """A block that ends in a placeholder is hashed once its token is known: prompts that
    continue earlier outputs hit the cache exactly as often, and get the same tokens."""
    first = prompts_of(9, 8)
    params = SamplingParams(temperature=0, max_tokens=37, ignore_eos=True)
    hits = []
    for async_scheduling in (False, True):
        llm = LLM(str(tiny_llama_path), **ENGINE, block_size=4, async_scheduling=async_scheduling)
        outs = llm.generate(first, params)
        again = [p + o.outputs[0].token_ids + [1, 2] for p, o in zip(first, outs)]
        block_manager = llm.engine.block_manager
        before = block_manager.num_prefix_cache_hits
        hits.append((outputs(llm, again, params), block_manager.num_prefix_cache_hits - before))
    assert hits[1] == hits[0]
    assert hits[0][1] >= 8 * 36


def test_requests_that_need_their_tokens_run_synchronous_steps(tiny_llama_path):
    """Penalties count the host's tokens: while such a request runs, steps go one at a time."""
    prompts = prompts_of(4, 10)
    params = [
        SamplingParams(temperature=0, max_tokens=25, ignore_eos=True,
                       repetition_penalty=1.3 if i == 0 else 1.0, presence_penalty=0.5 * (i == 1))
        for i in range(len(prompts))
    ]  # fmt: skip
    sync, result, llm = both(tiny_llama_path, prompts, params)
    assert result == sync
    assert llm.overlapped == 0  # every request ran beside the penalized ones


def test_beam_search_equals(tiny_llama_path):
    from pagedgen.core.beam_search import BeamSearchParams

    prompts = prompts_of(5, 3)
    beam = BeamSearchParams(beam_width=3, max_tokens=8)
    sync = LLM(str(tiny_llama_path), **ENGINE).beam_search(prompts, beam)
    result = LLM(str(tiny_llama_path), **ENGINE, async_scheduling=True).beam_search(prompts, beam)
    assert [[c.token_ids for c in o.outputs] for o in result] == [
        [c.token_ids for c in o.outputs] for o in sync
    ]


def test_abort_while_a_step_is_in_flight(tiny_llama_path):
    """An aborted sequence drops its placeholder; the others finish as they would have."""
    prompts = prompts_of(6, 6)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    sync = outputs(LLM(str(tiny_llama_path), **ENGINE), prompts, params)

    engine = LLM(str(tiny_llama_path), **ENGINE, async_scheduling=True).engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    finished = []
    for _ in range(4):
        finished += engine.step()
    assert engine.in_flight is not None
    seq = engine.requests["2"].group.seqs[0]
    assert seq.token_ids[-1] == PLACEHOLDER and seq.num_output_placeholders == 1
    engine.abort_request("2")
    assert PLACEHOLDER not in seq.token_ids and seq.is_finished
    while engine.has_unfinished_requests():
        finished += engine.step()
    engine.block_manager.check_integrity()
    got = {out.request_id: out.outputs[0].token_ids for out in finished}
    assert "2" not in got
    assert got == {str(i): sync[i][0][0] for i in range(len(prompts)) if i != 2}


def test_decode_graph_buffers_take_the_placeholders(tiny_llama_path):
    """Replayed decode steps read their placeholders' tokens from the graph's input buffer."""
    from tests.worker.graphs.test_cuda_graphs import replay_eagerly

    prompts = prompts_of(7, 20)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kwargs = dict(kv_cache_memory=0.01, max_num_seqs=20)
    sync = outputs(LLM(str(tiny_llama_path), **ENGINE, **kwargs), prompts, params)
    llm = LLM(str(tiny_llama_path), **ENGINE, async_scheduling=True, **kwargs)
    capture_decode_graphs(llm.engine.runner, capture=replay_eagerly)
    overlapped = count_placeholder_steps(llm)
    assert outputs(llm, prompts, params) == sync
    assert overlapped[0] >= 20


def test_placeholder_tokens_come_from_the_previous_steps_device_samples(tiny_llama_path):
    """The runner's side alone: a decode whose token is a placeholder gets the token the last
    step sampled for it, whatever its row there."""
    llm = LLM(str(tiny_llama_path), **ENGINE)
    engine = llm.engine
    for i, prompt in enumerate(prompts_of(8, 3)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=5))
    engine.step()  # the prefills
    seqs = [engine.requests[str(i)].group.seqs[0] for i in range(3)]
    runner = engine.runner
    runner.last_sampled = LastSamples(torch.tensor([11, 22, 33]), [seqs[2], seqs[0], seqs[1]])
    for seq in seqs[:2]:
        seq.append_placeholder()
    scheduled = engine.scheduler.schedule()
    arrays = runner.prepare_arrays(scheduled)
    # Each computes 2 tokens, its sample and the placeholder after it, which ends its rows.
    ends = [int(arrays.cu_seqlens_q[scheduled.seqs.index(seq) + 1]) - 1 for seq in seqs[:2]]
    assert arrays.placeholders is not None
    assert arrays.placeholders[0].tolist() == sorted(ends)
    inputs = runner.prepare(scheduled)
    assert inputs.input_ids[ends].tolist() == [22, 33]
    assert PLACEHOLDER not in inputs.input_ids.tolist()
