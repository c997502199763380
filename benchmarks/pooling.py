"""The pooling runner (embeddings, classification): pagedgen and vLLM's CPU backend side by side
on the same prompts:

    python benchmarks/pooling.py [--task embed|classify] [--num-prompts 1000] [--dtype float32]
        [--pooling-type LAST] [--no-vllm]

ShareGPT-N's prompts as `pagedgen bench` builds them (SmolLM2-135M-Instruct's chat template).
embed: SmolLM2 as an embedder (LLM.embed, L2-normalized). classify: SmolLM2's decoder under a
random 2-label score head (LlamaForSequenceClassification, saved once to a temporary folder),
softmax scores (LLM.classify). Prompt tok/s is the best of two passes with the prefix cache
emptied before each (within a pass, both engines reuse the system prompt's blocks under LAST
pooling). The engines' vectors for each prompt are compared: cosine similarity for embeddings,
the largest absolute difference for scores.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from vllm_cpu import run_vllm  # benchmarks/, beside this script

from pagedgen import LLM
from pagedgen.entrypoints.bench.workload_file import save_workload
from pagedgen.entrypoints.bench.workloads import sharegpt_workload
from pagedgen.kernels.cpu_features import isa_name
from pagedgen.loader import DEFAULT_MODEL, resolve_model


def pool(llm: LLM, task: str, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    """(prompt tok/s, the best of two passes; the vectors)"""
    best = 0.0
    for _ in range(2):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = getattr(llm, task)(prompts, use_tqdm=False)
        best = max(best, sum(map(len, prompts)) / (time.perf_counter() - start))
    if task == "classify":
        return best, torch.tensor([o.outputs.probs for o in outputs])
    return best, torch.tensor([o.outputs.embedding for o in outputs])


def classifier_folder(model: Path, folder: Path) -> Path:
    """SmolLM2's decoder under a random 2-label score head, as a classifier checkpoint."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    from pagedgen.loader.dense_copy import dense_folder

    classifier = AutoModelForSequenceClassification.from_pretrained(
        dense_folder(model), num_labels=2, dtype=torch.float32
    )
    classifier.config.pad_token_id = classifier.config.eos_token_id
    classifier.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="embed", choices=["embed", "classify"])
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--pooling-type", default="LAST", choices=["LAST", "MEAN", "CLS"])
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = resolve_model(DEFAULT_MODEL).path
        if args.task == "classify":
            model = classifier_folder(model, Path(tmp) / "classifier")
        pooler_config = {"pooling_type": args.pooling_type}
        llm = LLM(str(model), dtype=args.dtype, runner="pooling", pooler_config=pooler_config)
        workload = sharegpt_workload(llm.tokenizer, args.num_prompts)
        prompts = [list(p) for p in workload.prompts]
        print(
            f"# {isa_name()}; SmolLM2-135M-Instruct {args.dtype}, {args.task}, "
            f"{args.pooling_type} pooling, ShareGPT-{len(prompts)}: "
            f"{sum(map(len, prompts)):,} prompt tokens (longest {max(map(len, prompts))})"
        )
        rate, ours = pool(llm, args.task, prompts)
        hit_rate = llm.engine.stats.prefix_cache_hit_rate
        print(f"pagedgen  {rate:10,.1f} prompt tok/s (prefix cache hit rate {hit_rate:.1%})")
        if args.no_vllm:
            return
        del llm
        path, out = Path(tmp) / "workload.json", Path(tmp) / "vllm.json"
        save_workload(workload, path)
        options = {"dtype": args.dtype, "pooler_config": pooler_config, "task": args.task}
        result = run_vllm(model, path, out, options)
    theirs = torch.tensor(result["vectors"])
    vllm_rate = result["prompt_tokens_per_s"]
    print(f"vLLM-CPU  {vllm_rate:10,.1f} prompt tok/s")
    print(f"ratio     {rate / vllm_rate:10.2f}x")
    if args.task == "classify":
        agreement = f"largest score difference {(ours - theirs).abs().max():.2e}"
    else:
        cosine = torch.nn.functional.cosine_similarity(ours.double(), theirs.double(), dim=1)
        agreement = f"cosine similarity min {cosine.min():.6f}, mean {cosine.mean():.6f}"
    print(f"the two engines' vectors: {agreement}")
    print(json.dumps({"pagedgen": rate, "vllm": vllm_rate, "task": args.task}))


if __name__ == "__main__":
    main()
