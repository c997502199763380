"""Host time of a step's attention calls through the cupy backend, its launches stubbed, so no
GPU is needed: what planning costs an eager or piecewise step, layer by layer, before CuPy
launches anything. A mixed step of SmolLM2's shape by default (30 layers, 9/3 heads of 64; 250
decode rows beside 4 prompts of 120 tokens):

    python benchmarks/attention_host.py [--layers 30] [--heads 9 3] [--decodes 250]
"""

import argparse
import random
import time
from statistics import median

import torch

from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.kernels import loader


def mixed_metadata(
    num_decodes: int, prompt_lens: list[int], block_size: int, num_blocks: int
) -> AttentionMetadata:
    rng = random.Random(0)
    query_lens = [1] * num_decodes + prompt_lens
    context_lens = [rng.randrange(50, 600) for _ in range(num_decodes)] + prompt_lens
    width = -(-max(context_lens) // block_size)
    tables = [[rng.randrange(num_blocks) for _ in range(width)] for _ in query_lens]
    cu_seqlens = [0]
    for n in query_lens:
        cu_seqlens.append(cu_seqlens[-1] + n)
    return AttentionMetadata(
        slot_mapping=torch.zeros(cu_seqlens[-1], dtype=torch.int64),
        cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        max_seqlen_q=max(query_lens),
        max_context_len=max(context_lens),
        block_size=block_size,
        num_decode_seqs=num_decodes,
        query_lens_cpu=query_lens,
        context_lens_cpu=context_lens,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--heads", type=int, nargs=2, default=[9, 3], help="query, kv heads")
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--decodes", type=int, default=250)
    parser.add_argument("--prompts", type=int, nargs="*", default=[120] * 4)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    launches = []
    loader.launch = launches.append  # nothing runs: planning is what is timed
    backend = CupyAttentionBackend.__new__(CupyAttentionBackend)  # __init__ insists on a GPU
    num_heads, num_kv_heads = args.heads
    block_size, num_blocks, dtype = 16, 512, torch.bfloat16
    pool = torch.zeros(args.layers, 2, num_blocks, block_size, num_kv_heads, args.head_size)
    pool = pool.to(dtype)
    num_tokens = args.decodes + sum(args.prompts)
    width = (num_heads + 2 * num_kv_heads) * args.head_size
    qkv = torch.zeros(num_tokens, width, dtype=dtype)
    q = qkv[:, : num_heads * args.head_size].view(num_tokens, num_heads, args.head_size)
    times = []
    for _ in range(args.steps):
        metadata = mixed_metadata(args.decodes, args.prompts, block_size, num_blocks)
        launches.clear()
        start = time.perf_counter()
        backend.prepare(metadata)
        for layer in range(args.layers):
            backend.attend(q, None, None, pool[layer, 0], pool[layer, 1], metadata, 0.125)
        times.append(time.perf_counter() - start)
    step_ms = 1e3 * median(times)
    print(
        f"{args.layers} layers, {num_heads}/{num_kv_heads} heads of {args.head_size}, "
        f"{args.decodes} decode rows + prompts {args.prompts}: {step_ms:.3f} ms a step, "
        f"{1e3 * step_ms / args.layers:.1f} us a layer, {len(launches)} launches a step"
    )


if __name__ == "__main__":
    main()
