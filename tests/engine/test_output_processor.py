"""OutputProcessor.process hands back the requests that finished in a step in the order of
their first sample in it, looking only at the requests a sequence of which finished there."""

import random

import pytest

from pagedgen import SamplingParams
from pagedgen.config import EngineConfig
from pagedgen.core.runner import NullRunner
from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.engine.output_processor import OutputProcessor


def every_sampled_request_that_finished(scheduled, requests) -> list:
    """What process returned before it looked at fewer requests: each request the step
    sampled, in the order of its first sample, if it has finished."""
    request_ids = dict.fromkeys(seq.request_id for seq in scheduled.sample_seqs)
    return [
        requests[request_id]
        for request_id in request_ids
        if request_id in requests and requests[request_id].is_finished
    ]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finished_requests_come_in_the_order_the_step_sampled_them(monkeypatch, async_scheduling):
    process = OutputProcessor.process
    steps = [0, 0]  # steps, of which with a request finished

    def checked(self, scheduled, samples, requests):
        num_sampled, finished = process(self, scheduled, samples, requests)
        assert finished == every_sampled_request_that_finished(scheduled, requests)
        steps[0] += 1
        steps[1] += len(finished) > 1
        return num_sampled, finished

    monkeypatch.setattr(OutputProcessor, "process", checked)
    config = EngineConfig(
        model="unused", block_size=4, max_num_seqs=24, async_scheduling=async_scheduling
    )
    # 40 blocks of 4 tokens for up to 24 sequences of up to 40 tokens: preemptions too
    engine = LLMEngine(config, NullRunner(lambda seq: 1 + seq.num_tokens % 50), None, 40, 0, 256,
                       {0}, vocab_size=257)  # fmt: skip
    rng = random.Random(0)
    for i in range(60):
        params = SamplingParams(
            n=rng.choice([1, 1, 1, 2, 3]),
            max_tokens=rng.randint(1, 20),
            stop_token_ids=[rng.randint(5, 50)] if i % 4 == 0 else None,
            seed=i,
            detokenize=False,
        )
        prompt = [rng.randint(1, 200) for _ in range(rng.randint(1, 20))]
        engine.add_request(f"r{i}", prompt, params)
    outputs = list(engine.stream([]))
    assert sorted(out.request_id for out in outputs) == sorted(f"r{i}" for i in range(60))
    assert steps[0] > 20 and steps[1] > 3, steps
    assert sum(engine.scheduler.num_preemptions.values()) > 0
