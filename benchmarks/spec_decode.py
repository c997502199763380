"""Speculative decoding by n-gram prompt lookup, pagedgen against vLLM's CPU backend with the
same speculative_config, on the same prompts:

    python benchmarks/spec_decode.py [--num-prompts 64] [--k 4] [--dtype float32] [--no-vllm]

Workloads (greedy, ignore_eos): "sharegpt", ShareGPT-N as `pagedgen bench` runs it (max_tokens
the reference answer's length, at most 128), all at once; "sharegpt batch 1", its first 8
prompts one request at a time (128 tokens each); "copy", the first N ShareGPT human turns of at
most 256 tokens asked back word for word (128 tokens each), all at once: text that quotes its
prompt, as summaries, edits and extraction do. For each, output tok/s of both engines with and
without drafts (best of two passes), the ratios, pagedgen's draft acceptance, and how many
greedy tokens agree with vLLM's. --schedule gives both engines vLLM's dynamic speculative
decoding (num_speculative_tokens_per_batch_size). vLLM runs as benchmarks/vllm_cpu.py says.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from vllm_cpu import run_vllm  # benchmarks/, beside this script

from pagedgen import LLM, SamplingParams
from pagedgen.entrypoints.bench.result import agreement
from pagedgen.entrypoints.bench.workload_file import save_workload
from pagedgen.entrypoints.bench.workloads import (
    Workload,
    encode_prompt,
    sharegpt_workload,
)
from pagedgen.entrypoints.io.sharegpt import iter_sharegpt_records
from pagedgen.kernels.cpu_features import isa_name
from pagedgen.loader import DEFAULT_MODEL, resolve_model


def copy_workload(tokenizer, num_prompts: int) -> Workload:
    prompts = []
    for record in iter_sharegpt_records():
        turns = record.get("conversations") or []
        if not turns or turns[0].get("from") != "human":
            continue
        text = turns[0]["value"]
        if 32 <= len(tokenizer.encode(text)) <= 256:
            ask = f"Repeat the following text word for word.\n\n{text}"
            prompts.append(encode_prompt(tokenizer, ask, True))
        if len(prompts) == num_prompts:
            break
    return Workload(f"copy-{num_prompts}", prompts, [128] * num_prompts, "chat template")


def run_pagedgen(llm: LLM, workload: Workload, one_at_a_time: bool) -> tuple[float, list, float]:
    """(output tok/s of the best of two passes, token ids, draft acceptance rate)"""
    params = [
        SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in workload.max_tokens
    ]
    batches = [[i] for i in range(workload.num_requests)] if one_at_a_time else [None]
    best, stats = 0.0, llm.engine.stats.spec_decode
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    for _ in range(2):
        llm.reset_prefix_cache()
        outputs = []
        start = time.perf_counter()
        for batch in batches:
            rows = range(workload.num_requests) if batch is None else batch
            outputs += llm.generate(
                [workload.prompts[i] for i in rows], [params[i] for i in rows], use_tqdm=False
            )
        best = max(best, sum(workload.max_tokens) / (time.perf_counter() - start))
    rate = (stats.num_accepted_tokens - accepted) / max(stats.num_draft_tokens - drafted, 1)
    return best, [o.outputs[0].token_ids for o in outputs], rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup-min", type=int, default=2)
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument(
        "--schedule",
        help='num_speculative_tokens_per_batch_size as JSON, e.g. "[[1, 16, 4], [17, 256, 0]]"',
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--workloads", default="sharegpt,sharegpt batch 1,copy")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false")
    args = parser.parse_args()
    torch.set_num_threads(2)
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.k,
        "prompt_lookup_min": args.lookup_min,
        "prompt_lookup_max": args.lookup_max,
    }
    if args.schedule:
        spec["num_speculative_tokens_per_batch_size"] = json.loads(args.schedule)
    model = resolve_model(DEFAULT_MODEL).path
    tmp = Path(tempfile.mkdtemp(prefix="pagedgen-spec-"))
    quiet = {"log": lambda message: None, "dtype": args.dtype}
    engines = {
        "plain": LLM(str(model), **quiet),
        "ngram": LLM(str(model), speculative_config=spec, **quiet),
    }
    tokenizer = engines["plain"].tokenizer
    sharegpt = sharegpt_workload(tokenizer, args.num_prompts)
    first = sharegpt.prompts[:8]
    workloads = {
        "sharegpt": lambda: sharegpt,
        "sharegpt batch 1": lambda: Workload(
            f"sharegpt-{len(first)}", first, [128] * len(first), "chat template"
        ),
        "copy": lambda: copy_workload(tokenizer, args.num_prompts),
    }
    print(f"{args.dtype}, CPU {isa_name()}, speculative_config {spec}; output tok/s")
    for name in args.workloads.split(","):
        workload, one_at_a_time = workloads[name](), name.endswith("batch 1")
        save_workload(workload, tmp / "workload.json")
        figures = {}
        for label, llm in engines.items():
            rate, ids, acceptance = run_pagedgen(llm, workload, one_at_a_time)
            figures[label] = rate
            line = f"{name} {label}: pagedgen {rate:.1f}"
            if label == "ngram":
                line += f" (drafts accepted {acceptance:.1%})"
            if args.vllm:
                options = {"dtype": args.dtype, "one_at_a_time": one_at_a_time}
                options["speculative_config"] = spec if label == "ngram" else None
                vllm = run_vllm(model, tmp / "workload.json", tmp / "vllm.json", options)
                theirs = vllm["output_tokens_per_s"]
                agree = agreement(ids, vllm["output_token_ids"])
                line += f", vLLM {theirs:.1f} ({rate / theirs:.2f}x); "
                line += f"{agree['num_matching_prefix_tokens']:,} of {agree['num_tokens']:,} "
                line += "tokens identical up to each completion's first difference"
            print(line, flush=True)
        print(
            f"{name}: pagedgen ngram / plain {figures['ngram'] / figures['plain']:.2f}x", flush=True
        )


if __name__ == "__main__":
    main()
