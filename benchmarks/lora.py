"""Multi-LoRA throughput, pagedgen against vLLM's CPU backend on the same prompts:

    python benchmarks/lora.py [--num-prompts 64] [--adapters 4] [--rank 16] [--dtype float32]

Builds --adapters random adapters of the default model with PEFT (rank --rank on all seven
projections), then runs ShareGPT prompts greedily with request i on adapter i % N, and without
adapters, alternating pagedgen and vLLM (best of two passes each), and prints output tok/s, the
ratios and how many greedy tokens agree. vLLM runs as benchmarks/vllm_cpu.py says; --no-vllm
runs pagedgen alone.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch
from vllm_cpu import run_vllm  # benchmarks/, beside this script

from pagedgen import LLM, LoRARequest, SamplingParams
from pagedgen.entrypoints.bench.result import agreement
from pagedgen.entrypoints.bench.workload_file import save_workload
from pagedgen.entrypoints.bench.workloads import sharegpt_workload
from pagedgen.kernels.cpu_features import isa_name
from pagedgen.loader import DEFAULT_MODEL, resolve_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(model: Path, folder: Path, count: int, rank: int) -> list[str]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pagedgen.loader.dense_copy import dense_folder

    paths = []
    for i in range(count):
        torch.manual_seed(i)
        base = AutoModelForCausalLM.from_pretrained(dense_folder(model), dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS)
        adapted = get_peft_model(base, config)
        for name, param in adapted.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero; small, so the text stays coherent
                param.data.normal_(0, 0.02)
        adapted.save_pretrained(folder / f"adapter{i}")
        paths.append(str(folder / f"adapter{i}"))
    return paths


def run_pagedgen(llm: LLM, prompts, max_tokens, loras) -> tuple[float, list[list[int]]]:
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    per_prompt = [loras[i % len(loras)] for i in range(len(prompts))] if loras else None
    best = 0.0
    for _ in range(2):
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, per_prompt)
        best = max(best, sum(max_tokens) / (time.perf_counter() - start))
    return best, [o.outputs[0].token_ids for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false")
    args = parser.parse_args()
    model = resolve_model(DEFAULT_MODEL).path
    tmp = Path(tempfile.mkdtemp(prefix="pagedgen-lora-"))
    adapters = make_adapters(model, tmp, args.adapters, args.rank)
    quiet = {"log": lambda message: None, "dtype": args.dtype}
    base = LLM(str(model), **quiet)
    lora = LLM(
        str(model), enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, **quiet
    )
    workload = sharegpt_workload(base.tokenizer, args.num_prompts)
    save_workload(workload, tmp / "workload.json")
    requests = [LoRARequest(f"a{i}", i + 1, path) for i, path in enumerate(adapters)]
    print(f"{args.num_prompts} ShareGPT prompts, {args.dtype}, CPU {isa_name()}; output tok/s")
    for label, llm, loras in (
        ("no adapters", base, []),
        (f"{args.adapters} adapters", lora, requests),
    ):
        rate, ids = run_pagedgen(llm, workload.prompts, workload.max_tokens, loras)
        line = f"{label}: pagedgen {rate:.1f}"
        if args.vllm:
            folders = [r.lora_path for r in loras]
            options = {"dtype": args.dtype, "adapters": folders, "max_lora_rank": args.rank}
            vllm = run_vllm(model, tmp / "workload.json", tmp / "vllm.json", options)
            theirs = vllm["output_tokens_per_s"]
            line += f", vLLM {theirs:.1f} ({rate / theirs:.2f}x); "
            agree = agreement(ids, vllm["output_token_ids"])
            line += f"{agree['num_matching_prefix_tokens']:,} of {agree['num_tokens']:,} tokens "
            line += "identical up to each completion's first difference"
        print(line, flush=True)


if __name__ == "__main__":
    main()
