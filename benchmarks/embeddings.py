"""Embeddings (runner "pooling"): pagedgen and vLLM's CPU backend side by side on the same prompts:

    python benchmarks/embeddings.py [--num-prompts 1000] [--dtype float32] [--pooling-type LAST]
        [--no-vllm]

ShareGPT-N's prompts as `pagedgen bench` builds them (SmolLM2-135M-Instruct's chat template),
each embedded whole (LLM.embed), L2-normalized. Prompt tok/s is the best of two passes with the
prefix cache emptied before each (within a pass, both engines reuse the system prompt's blocks
under LAST pooling). The two engines' embeddings of each prompt are compared by their cosine
similarity.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from vllm_cpu import run_vllm  # benchmarks/, beside this script

from pagedgen import LLM
from pagedgen.bench.workload_file import save_workload
from pagedgen.bench.workloads import sharegpt_workload
from pagedgen.cpu_features import isa_name
from pagedgen.loader import DEFAULT_MODEL, resolve_model


def embed(llm: LLM, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    """(prompt tok/s, the best of two passes; the embeddings)"""
    best = 0.0
    for _ in range(2):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = llm.embed(prompts, use_tqdm=False)
        best = max(best, sum(map(len, prompts)) / (time.perf_counter() - start))
    return best, torch.tensor([o.outputs.embedding for o in outputs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--pooling-type", default="LAST", choices=["LAST", "MEAN", "CLS"])
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()

    model = resolve_model(DEFAULT_MODEL).path
    pooler_config = {"pooling_type": args.pooling_type}
    llm = LLM(str(model), dtype=args.dtype, runner="pooling", pooler_config=pooler_config)
    workload = sharegpt_workload(llm.tokenizer, args.num_prompts)
    prompts = [list(p) for p in workload.prompts]
    num_tokens = sum(map(len, prompts))
    print(
        f"# {isa_name()}; SmolLM2-135M-Instruct {args.dtype}, {args.pooling_type} pooling, "
        f"ShareGPT-{len(prompts)}: {num_tokens:,} prompt tokens (longest {max(map(len, prompts))})"
    )
    rate, ours = embed(llm, prompts)
    hit_rate = llm.engine.stats.prefix_cache_hit_rate
    print(f"pagedgen  {rate:10,.1f} prompt tok/s (prefix cache hit rate {hit_rate:.1%})")
    if args.no_vllm:
        return
    del llm
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "workload.json", Path(tmp) / "vllm.json"
        save_workload(workload, path)
        options = {"dtype": args.dtype, "pooler_config": pooler_config}
        result = run_vllm(model, path, out, options)
    theirs = torch.tensor(result["embeddings"])
    vllm_rate = result["prompt_tokens_per_s"]
    cosine = torch.nn.functional.cosine_similarity(ours.double(), theirs.double(), dim=1)
    print(f"vLLM-CPU  {vllm_rate:10,.1f} prompt tok/s")
    print(f"ratio     {rate / vllm_rate:10.2f}x")
    print(
        f"cosine similarity of the two engines' embeddings: min {cosine.min():.6f}, "
        f"mean {cosine.mean():.6f}"
    )
    print(json.dumps({"pagedgen": rate, "vllm": vllm_rate, "min_cosine": cosine.min().item()}))


if __name__ == "__main__":
    main()
