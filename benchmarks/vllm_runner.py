"""The vLLM side of benchmarks/lora.py, spec_decode.py and kv_cache_dtype.py, run by the vLLM
virtualenv's python: a workload file through vLLM's LLM.generate; writes output tok/s (the best
of two passes) and the token ids.

    python vllm_runner.py MODEL W.json OUT.json OPTIONS_JSON

OPTIONS_JSON: {"dtype": "float32", "adapters": [folders], "max_lora_rank": 16,
"speculative_config": {...} or null, "kv_cache_dtype": "auto", "one_at_a_time": false,
"pooler_config": null}. With adapters, request i runs adapter i % N; one_at_a_time runs the
requests one generate call each (batch-1 latency). With pooler_config ({"pooling_type": ...}),
benchmarks/pooling.py's, the prompts are pooled instead (runner "pooling"; "task": "embed" or
"classify"): it writes prompt tok/s and the vectors (embeddings or class scores).
"""

import json
import sys
import time
from pathlib import Path


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    model, workload, out, options = sys.argv[1:]
    options = json.loads(options)
    data = json.loads(Path(workload).read_text())
    prompts, max_tokens = data["prompts"], data["max_tokens"]
    if options.get("pooler_config") is not None:
        Path(out).write_text(json.dumps(pool(model, prompts, options)))
        return
    folders = options.get("adapters", [])
    loras = [LoRARequest(f"a{i}", i + 1, f) for i, f in enumerate(folders)]
    per_prompt = [loras[i % len(loras)] for i in range(len(prompts))] if loras else None
    llm = LLM(
        model=model,
        dtype=options.get("dtype", "float32"),
        seed=0,
        enable_lora=bool(loras),
        max_loras=max(len(loras), 1),
        max_lora_rank=options.get("max_lora_rank", 16),
        speculative_config=options.get("speculative_config"),
        kv_cache_dtype=options.get("kv_cache_dtype", "auto"),
    )
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    batches = [[i] for i in range(len(prompts))] if options.get("one_at_a_time") else [None]
    rates = []
    for _ in range(2):
        llm.reset_prefix_cache()
        outputs = []
        start = time.perf_counter()
        for batch in batches:
            rows = range(len(prompts)) if batch is None else batch
            outputs += llm.generate(
                [inputs[i] for i in rows],
                [params[i] for i in rows],
                use_tqdm=False,
                lora_request=None if per_prompt is None else [per_prompt[i] for i in rows],
            )
        rates.append(sum(max_tokens) / (time.perf_counter() - start))
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    result = {"output_tokens_per_s": max(rates), "output_token_ids": ids}
    Path(out).write_text(json.dumps(result))


def pool(model: str, prompts: list[list[int]], options: dict) -> dict:
    """vLLM's pooling runner over the prompts: prompt tok/s (the best of two passes, the prefix
    cache emptied before each) and the embeddings or class scores."""
    from vllm import LLM
    from vllm.config.pooler import PoolerConfig

    llm = LLM(
        model=model,
        dtype=options.get("dtype", "float32"),
        seed=0,
        runner="pooling",
        pooler_config=PoolerConfig(**options["pooler_config"]),
    )
    inputs = [{"prompt_token_ids": p} for p in prompts]
    rates = []
    for _ in range(2):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        if options.get("task") == "classify":
            outputs = llm.classify(inputs, use_tqdm=False)
        else:
            outputs = llm.embed(inputs, use_tqdm=False)
        rates.append(sum(map(len, prompts)) / (time.perf_counter() - start))
    vectors = [
        o.outputs.probs if options.get("task") == "classify" else o.outputs.embedding
        for o in outputs
    ]
    return {"prompt_tokens_per_s": max(rates), "vectors": [list(v) for v in vectors]}


if __name__ == "__main__":  # vLLM's engine core starts by spawn, which imports this file again
    main()
