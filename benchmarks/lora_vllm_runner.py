"""benchmarks/lora.py's vLLM side, run by the vLLM virtualenv's python: a workload file through
vLLM's LLM.generate with request i on adapter i % N; writes output tok/s and the token ids.

    python lora_vllm_runner.py MODEL W.json OUT.json DTYPE MAX_LORA_RANK ADAPTER_DIR...
"""

import json
import sys
import time
from pathlib import Path


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    model, workload, out, dtype, rank, *folders = sys.argv[1:]
    data = json.loads(Path(workload).read_text())
    prompts, max_tokens = data["prompts"], data["max_tokens"]
    loras = [LoRARequest(f"a{i}", i + 1, f) for i, f in enumerate(folders)]
    per_prompt = [loras[i % len(loras)] for i in range(len(prompts))] if loras else None
    llm = LLM(
        model=model,
        dtype=dtype,
        seed=0,
        enable_lora=bool(loras),
        max_loras=max(len(loras), 1),
        max_lora_rank=int(rank),
    )
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    rates = []
    for _ in range(2):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outputs = llm.generate(inputs, params, use_tqdm=False, lora_request=per_prompt)
        rates.append(sum(max_tokens) / (time.perf_counter() - start))
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    result = {"output_tokens_per_s": max(rates), "output_token_ids": ids}
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":  # vLLM's engine core starts by spawn, which imports this file again
    main()
