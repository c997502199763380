"""Perplexity of a model over a text, from prompt logprobs, for weight formats side by side:

    python benchmarks/perplexity.py [--model M] [--dtype bfloat16] [--text FILE]
        [--window 1024] [--min-tokens 2000] [--max-tokens 4096] [--quantization none int8 ...]

The text (by default this checkout's docs/*.md and README.md, joined: the same every run) is
tokenized and cut into windows of --window tokens; each window is one prompt whose
prompt_logprobs give every token's log-probability given the window before it. The perplexity is
exp(-mean) over all scored tokens. Each --quantization value runs in turn (vLLM's option: none
keeps the checkpoint's own path, a GGUF file dequantized; int8 / int4 quantize at load; auto
leaves the checkpoint's format as it loads), and the table gives each one's perplexity and its
change against the first.
"""

import argparse
import math
import time
from pathlib import Path

from pagedgen import LLM, SamplingParams
from pagedgen.kernels.cpu_features import isa_name

ROOT = Path(__file__).resolve().parent.parent


def default_text() -> str:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n\n".join(f.read_text() for f in files)


def windows(token_ids: list[int], size: int) -> list[list[int]]:
    return [
        token_ids[i : i + size] for i in range(0, len(token_ids), size) if i + 2 <= len(token_ids)
    ]


def perplexity(llm: LLM, prompts: list[list[int]]) -> tuple[float, int]:
    """exp(-mean log-probability) of every prompt token after each window's first."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    total, count = 0.0, 0
    for prompt, output in zip(prompts, outputs):
        assert output.error is None, output.error
        for token_id, entry in zip(prompt[1:], output.prompt_logprobs[1:]):
            total += entry[token_id].logprob
            count += 1
    return math.exp(-total / count), count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--text", type=Path, default=None)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--min-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=4096, help="the text's first N tokens")
    parser.add_argument("--quantization", nargs="+", default=["auto"])
    args = parser.parse_args()
    text = args.text.read_text() if args.text else default_text()
    rows = []
    for quantization in args.quantization:
        engine_args = {"dtype": args.dtype, "log": lambda message: None}
        if args.model is not None:
            engine_args["model"] = args.model
        if quantization != "auto":
            engine_args["quantization"] = quantization
        llm = LLM(**engine_args)
        token_ids = llm.tokenizer.encode(text)[: args.max_tokens]
        if len(token_ids) < args.min_tokens:
            raise SystemExit(f"the text has {len(token_ids)} tokens, fewer than {args.min_tokens}")
        start = time.perf_counter()
        ppl, count = perplexity(llm, windows(token_ids, args.window))
        rows.append((quantization, ppl, count, time.perf_counter() - start))
        del llm
    print(f"perplexity, {rows[0][2]:,} tokens in windows of {args.window}; CPU {isa_name()}")
    print(f"{'quantization':<14}{'perplexity':>12}{'change':>10}{'seconds':>10}")
    for quantization, ppl, _, seconds in rows:
        change = 100 * (ppl / rows[0][1] - 1)
        print(f"{quantization:<14}{ppl:>12.4f}{change:>9.2f}%{seconds:>10.1f}")


if __name__ == "__main__":
    main()
