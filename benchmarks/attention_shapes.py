"""The decode batches the attention benchmarks (bench_kernels.py, sweep_decode.py,
ncu_attention.py) time, without torch.cuda: shapes, their context lengths and labels."""

import torch

# (num_seqs, context_len, num_heads, num_kv_heads, head_size, block_size); context_len SHAREGPT:
# each sequence's own length, as a decode step of the ShareGPT workload sees them (sharegpt_lens)
SHAREGPT = "sharegpt"
Shape = tuple[int | str, ...]
ATTENTION_SHAPES: list[Shape] = [
    (1, 4096, 32, 8, 128, 16),
    (16, 2048, 32, 8, 128, 16),
    (64, 1024, 32, 8, 128, 16),
    (256, 512, 32, 8, 128, 16),
    (64, 1024, 9, 3, 64, 16),  # SmolLM2-135M
    (32, 8192, 32, 8, 128, 32),
    (256, SHAREGPT, 32, 8, 128, 16),  # Llama-3-8B's decode steps in `pagedgen bench`
]


def sharegpt_lens(num_seqs: int) -> list[int]:
    """Context lengths of num_seqs running sequences, fixed (seed 0): a prompt of ShareGPT's
    (log-normal, median 55 and mean ~99 tokens, at most 511, as benchmarks/gpu_inputs.py's 1,000)
    and 1 to 128 tokens generated so far. Short and uneven: one sequence a thread block (v1)
    leaves most blocks little to read and the longest ones to finish alone."""
    generator = torch.Generator().manual_seed(0)
    prompts = torch.empty(num_seqs).log_normal_(4.0, 1.08, generator=generator)
    generated = torch.randint(1, 129, (num_seqs,), generator=generator)
    return (prompts.round().clamp(4, 511).long() + generated).tolist()


def is_uneven(shape: Shape) -> bool:
    """Its sequences differ in length, so the order a kernel takes them in matters."""
    return shape[1] == SHAREGPT


def context_lens(shape: Shape) -> list[int]:
    num_seqs, context = shape[:2]
    return sharegpt_lens(num_seqs) if is_uneven(shape) else [context] * num_seqs


def shape_label(shape: Shape) -> str:
    label = "seqs={} ctx={} heads={}/{} head={} block={}".format(*shape)
    if not is_uneven(shape):
        return label
    lens = context_lens(shape)
    return f"{label} (mean {sum(lens) / len(lens):.0f}, max {max(lens)})"
