"""8-bit KV caches (kv_cache_dtype fp8 / fp8_e5m2) against the model's own dtype, pagedgen and
vLLM's CPU backend side by side on the same prompts:

    python benchmarks/kv_cache_dtype.py [--num-prompts 64] [--dtype float32] [--no-vllm]
        [--small-pool-gib 0.1]

ShareGPT-N as `pagedgen bench` runs it (greedy, ignore_eos, SmolLM2-135M-Instruct). For each
kv_cache_dtype: output tok/s (best of two passes), the pool's tokens in the same memory, how many
greedy tokens agree with the run in the model's dtype (up to each completion's first
difference), and the cost in quality, teacher-forced: the auto run's completions scored as
prompts (prompt_logprobs) through each cache, the mean change in their tokens' log-probability.
vLLM runs the same kv_cache_dtype (as benchmarks/vllm_cpu.py says; its CPU backend takes fp8
caches on AVX-512 only). --small-pool-gib reruns pagedgen with a pool that small, where the
model's dtype must preempt and 8 bits need not.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch
from vllm_cpu import run_vllm  # benchmarks/, beside this script

from pagedgen import LLM, SamplingParams
from pagedgen.entrypoints.bench.result import agreement
from pagedgen.entrypoints.bench.workload_file import save_workload
from pagedgen.entrypoints.bench.workloads import Workload, sharegpt_workload
from pagedgen.kernels.cpu_features import isa_name
from pagedgen.loader import DEFAULT_MODEL, resolve_model

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e5m2")


def run(llm: LLM, workload: Workload) -> tuple[float, list[list[int]]]:
    """(output tok/s, the best of two passes; token ids)"""
    params = [
        SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in workload.max_tokens
    ]
    best = 0.0
    for _ in range(2):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = llm.generate(workload.prompts, params, use_tqdm=False)
        best = max(best, sum(workload.max_tokens) / (time.perf_counter() - start))
    return best, [o.outputs[0].token_ids for o in outputs]


def completion_logprobs(
    llm: LLM, prompts: list[list[int]], completions: list[list[int]]
) -> torch.Tensor:
    """Each completion token's log-probability given its prompt and the completion before it."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([p + c for p, c in zip(prompts, completions)], params, use_tqdm=False)
    logprobs = []
    for prompt, completion, output in zip(prompts, completions, outputs):
        steps = output.prompt_logprobs[len(prompt) :]
        logprobs += [step[token].logprob for step, token in zip(steps, completion)]
    return torch.tensor(logprobs, dtype=torch.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--small-pool-gib", type=float, default=None)
    parser.add_argument("--no-vllm", dest="vllm", action="store_false")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = resolve_model(DEFAULT_MODEL).path
    tmp = Path(tempfile.mkdtemp(prefix="pagedgen-kv-dtype-"))
    quiet = {"log": lambda message: None, "dtype": args.dtype}
    llms = {name: LLM(str(model), kv_cache_dtype=name, **quiet) for name in KV_CACHE_DTYPES}
    workload = sharegpt_workload(llms["auto"].tokenizer, args.num_prompts)
    save_workload(workload, tmp / "workload.json")
    print(f"{args.dtype} model, CPU {isa_name()}, {workload.name}; output tok/s", flush=True)
    ids, rates, vllm_ids = {}, {}, {}
    for name, llm in llms.items():
        rates[name], ids[name] = run(llm, workload)
        runner = llm.engine.runner
        pool = runner.num_blocks * runner.block_size
        line = (
            f"{name} ({runner.kv_cache_dtype}, {runner.geometry.bytes_per_token} bytes/token, "
            f"{pool:,} tokens in 4 GiB): pagedgen {rates[name]:.1f}"
        )
        if name != "auto":
            same = agreement(ids[name], ids["auto"])
            line += (
                f" ({rates[name] / rates['auto']:.2f}x auto; {same['num_matching_prefix_tokens']:,}"
            )
            line += f" of {same['num_tokens']:,} tokens as auto's)"
        if args.vllm:
            options = {"dtype": args.dtype, "kv_cache_dtype": name}
            try:
                vllm = run_vllm(model, tmp / "workload.json", tmp / "vllm.json", options)
            except Exception as e:  # noqa: BLE001 (vLLM refusing a cache type is a finding)
                line += f"; vLLM failed: {type(e).__name__}"
            else:
                theirs, vllm_ids[name] = vllm["output_tokens_per_s"], vllm["output_token_ids"]
                line += f"; vLLM {theirs:.1f} ({rates[name] / theirs:.2f}x)"
                if name != "auto" and "auto" in vllm_ids:
                    same = agreement(vllm_ids[name], vllm_ids["auto"])
                    line += f", {same['num_matching_prefix_tokens']:,} tokens as its auto's"
        print(line, flush=True)

    completions = ids["auto"]
    base = completion_logprobs(llms["auto"], workload.prompts, completions)
    for name in KV_CACHE_DTYPES[1:]:
        delta = completion_logprobs(llms[name], workload.prompts, completions) - base
        print(
            f"{name}: the auto completions' {len(base):,} tokens, log-probability change mean "
            f"{delta.mean():+.4f}, mean |change| {delta.abs().mean():.4f}, max |change| "
            f"{delta.abs().max():.3f} (auto's mean log-probability {base.mean():.4f})",
            flush=True,
        )

    if args.small_pool_gib:
        del llms
        for name in KV_CACHE_DTYPES[:2]:
            llm = LLM(str(model), kv_cache_dtype=name, kv_cache_memory=args.small_pool_gib, **quiet)
            before = llm.engine.stats.num_preemptions
            rate, _ = run(llm, workload)
            print(
                f"{args.small_pool_gib} GiB pool, {name}: pagedgen {rate:.1f}, "
                f"{llm.engine.stats.num_preemptions - before} preemptions over two passes",
                flush=True,
            )


if __name__ == "__main__":
    main()
