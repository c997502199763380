"""Structured output on SmolLM2: the proof on ShareGPT extraction prompts, and what it costs.

    python benchmarks/structured_output.py [--num-prompts 200] [--num-threads N]

Proof: every completion of the extraction prompts under tests/structured_workload.py's JSON
schema parses and validates (jsonschema), greedy with a large pool, greedy with a pool small
enough to force recompute preemption (and token for token equal to the large pool's), and n = 4
sampled with a small pool under swap preemption. Benchmark: output tokens/s at batch 64 with the
schema against the same prompts unconstrained (ignore_eos, each request as long as its
constrained completion), alternated twice; the grammar compile time per schema and the bitmask
time per step.
"""

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.structured_workload

from pagedgen import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
from tests.structured_workload import (  # noqa: E402
    EXTRACTION_SCHEMA,
    MAX_EXTRACTION_TOKENS,
    extraction_messages,
    validation_error,
)

BATCH = 64
SMALL_POOL_GIB = 0.11  # 160 blocks of 16 SmolLM2 tokens: a tenth of what 64 sequences need


def constrained(**kwargs) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_EXTRACTION_TOKENS,
        structured_outputs=StructuredOutputsParams(json=EXTRACTION_SCHEMA),
        **kwargs,
    )


def check(name: str, outputs: list, llm: LLM) -> list[list[int]]:
    completions = [c for out in outputs for c in out.outputs]
    errors = [out.error for out in outputs if out.error]
    invalid = [(c.text, validation_error(c.text)) for c in completions]
    invalid = [(text, why) for text, why in invalid if why]
    reasons = sorted({c.finish_reason for c in completions})
    stats = llm.engine.stats
    print(
        f"{name}: {len(completions) - len(invalid)}/{len(completions)} completions valid, "
        f"{len(errors)} request errors, finish reasons {reasons}, preemptions "
        f"{stats.num_preemptions_by_mode}, blocks swapped out {stats.num_blocks_swapped_out}"
    )
    for text, why in invalid[:3]:
        print(f"  invalid: {why}: {text[:200]!r}")
    return [c.token_ids for c in completions]


def timed_generate(llm: LLM, prompts: list, params: list[SamplingParams]) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(out.num_output_tokens for out in outputs)


def benchmark(llm: LLM, prompts: list[list[int]]) -> None:
    grammar = llm.engine.structured_output
    lengths = [
        len(out.outputs[0].token_ids) for out in llm.generate(prompts, constrained(temperature=0))
    ]
    free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    rates: dict[str, list[float]] = {"unconstrained": [], "json schema": []}
    for _ in range(2):
        for name, params in (
            ("unconstrained", free),
            ("json schema", [constrained(temperature=0)] * len(prompts)),
        ):
            before, stats = copy.copy(grammar.stats), llm.engine.stats
            steps_before, model_before = stats.num_steps, stats.model_time
            elapsed, num_tokens = timed_generate(llm, prompts, params)
            rates[name].append(num_tokens / elapsed)
            step_ms = 1e3 * (stats.model_time - model_before) / (stats.num_steps - steps_before)
            print(
                f"  {name}: {num_tokens} output tokens in {elapsed:.1f} s "
                f"= {num_tokens / elapsed:.1f} tok/s; model step {step_ms:.1f} ms on average"
            )
            if name == "json schema":
                steps = grammar.stats.num_masked_steps - before.num_masked_steps
                fill = grammar.stats.bitmask_fill_time_s - before.bitmask_fill_time_s
                apply = grammar.stats.bitmask_apply_time_s - before.bitmask_apply_time_s
                rows = (grammar.stats.num_masked_rows - before.num_masked_rows) / steps
                print(
                    f"    mask per step: {1e3 * (fill + apply) / steps:.2f} ms "
                    f"(fill {1e3 * fill / steps:.2f}, apply {1e3 * apply / steps:.2f}) "
                    f"for {rows:.1f} rows on average"
                )
    ratio = statistics.median(rates["json schema"]) / statistics.median(rates["unconstrained"])
    print(f"output tok/s with the schema / unconstrained at batch {BATCH}: {ratio:.1%}")


def compile_times(llm: LLM) -> None:
    backend = llm.engine.structured_output.backend
    times = []
    for i in range(20):
        schema = copy.deepcopy(EXTRACTION_SCHEMA)
        schema["properties"]["category"]["enum"].append(f"other-{i}")
        start = time.perf_counter()
        backend.compile(StructuredOutputsParams(json=schema))
        times.append(time.perf_counter() - start)
    for name, params in (
        ("regex", StructuredOutputsParams(regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}")),
        ("choice", StructuredOutputsParams(choice=["positive", "negative", "neutral"])),
        ("json_object", StructuredOutputsParams(json_object=True)),
    ):
        start = time.perf_counter()
        backend.compile(params)
        print(f"  compile {name}: {1e3 * (time.perf_counter() - start):.2f} ms")
    print(
        f"  compile 20 distinct extraction schemas: mean {1e3 * statistics.mean(times):.2f} ms, "
        f"max {1e3 * max(times):.2f} ms; tokenizer set-up once: "
        f"{1e3 * llm.engine.structured_output.stats.backend_setup_time_s:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args()
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    engine_args = dict(num_threads=args.num_threads, max_num_seqs=BATCH, log=log)

    llm = LLM(kv_cache_memory=1.0, **engine_args)
    chats = extraction_messages(args.num_prompts)
    prompts = [llm.apply_chat_template(chat) for chat in chats]
    reference = check("greedy, large pool", llm.generate(prompts, constrained(temperature=0)), llm)
    compile_times(llm)
    benchmark(llm, prompts[:BATCH])
    del llm

    small = LLM(kv_cache_memory=SMALL_POOL_GIB, preemption_mode="recompute", **engine_args)
    token_ids = check(
        "greedy, small pool", small.generate(prompts, constrained(temperature=0)), small
    )
    same = sum(a == b for a, b in zip(token_ids, reference))
    print(f"  token for token equal to the large pool's: {same}/{len(reference)}")
    del small

    small = LLM(kv_cache_memory=SMALL_POOL_GIB, preemption_mode="swap", **engine_args)
    sampled = constrained(n=4, temperature=0.8, seed=0)
    check(
        "n = 4 sampled, small pool",
        small.generate(prompts[: args.num_prompts // 4], sampled),
        small,
    )


if __name__ == "__main__":
    main()
