"""LoRA in the control plane, torch-free: at most max_loras adapters run at once, a request
whose adapter would be one too many waits while those behind it go ahead, and prefix-cache
blocks are shared only between sequences of the same adapter (the shadow KV cache checks every
context against the adapter that computed it)."""

import random
from dataclasses import replace

import pytest

from pagedgen.config import EngineConfig
from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.lora import LoRARequest
from pagedgen.sampling_params import SamplingParams
from tests.core.kv_shadow import ShadowRunner, run_step

ADAPTERS = [LoRARequest(f"adapter-{i}", i, f"/adapters/{i}") for i in (1, 2, 3)]


def lora_engine(max_loras: int = 2, max_num_seqs: int = 8, num_blocks: int = 64) -> LLMEngine:
    config = EngineConfig(
        model="unused",
        block_size=4,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        enable_lora=True,
        max_loras=max_loras,
    )
    runner = ShadowRunner(4, num_blocks)
    return LLMEngine(config, runner, None, num_blocks, 0, 256, set())


def params(max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, detokenize=False)


def running_loras(engine: LLMEngine) -> set[int]:
    return {g.lora_int_id for g in engine.scheduler.running if g.lora_int_id}


def test_a_third_adapter_waits_and_the_base_model_goes_ahead():
    engine = lora_engine(max_loras=2)
    for i, lora in enumerate([*ADAPTERS, None]):
        engine.add_request(str(i), [10 + i] * 5, params(), lora)
    out = run_step(engine)
    assert [seq.request_id for seq in out.seqs] == ["0", "1", "3"]
    assert running_loras(engine) == {1, 2}
    assert [g.request_id for g in engine.scheduler.waiting] == ["2"]
    while engine.has_unfinished_requests():
        run_step(engine)
        assert len(running_loras(engine)) <= 2
    assert engine.runner.num_steps > 6  # adapter 3 ran after the others


@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_shared_prompts_share_blocks_only_within_an_adapter(max_loras):
    rng = random.Random(max_loras)
    engine = lora_engine(max_loras=max_loras, num_blocks=40)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    groups = []
    for i in range(24):
        lora = rng.choice([None, *ADAPTERS])
        engine.add_request(str(i), rng.choice(prompts), params(rng.randint(1, 9)), lora)
        groups.append(engine.requests[str(i)].group)
    while engine.has_unfinished_requests():
        run_step(engine)  # the shadow checks every context the step reads
        assert len(running_loras(engine)) <= max_loras
    assert any(group.num_cached_tokens for group in groups)  # hits, each within an adapter


def test_lora_requests_need_an_engine_built_for_them():
    engine = lora_engine()
    engine.config = replace(engine.config, enable_lora=False)
    engine.scheduler.max_loras = None
    with pytest.raises(ValueError, match="enable_lora"):
        engine.add_request("0", [1, 2, 3], params(), ADAPTERS[0])


def test_lora_int_id_starts_at_one():
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("base", 0, "/adapters/0")
