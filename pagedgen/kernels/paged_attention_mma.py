"""The tensor-core decode kernels of kernels/paged_attention_mma.cu: one thread block per
(kv head, tile of up to 16 query heads, sequence[, partition]) computes the tile's scores and
outputs with mma.sync while cp.async streams K and V through shared memory. Planned by
paged_attention_launches(..., tensor_cores=True)."""

import torch

from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.launch import C_TYPES, KernelModule
from pagedgen.kernels.paged_attention_grouped import PARTITION_SIZES, fill_partition_size

# The v2 kernel's completion counters, zeros between launches (the last block of each tile and
# sequence resets its own), one buffer a device, only ever grown: a CUDA graph keeps its pointer.
MIN_COUNTERS = 1 << 16
_counters: dict[torch.device, list[torch.Tensor]] = {}

# kernels/decode_attend_mma.cuh's constants.
NUM_THREADS = 128
TILE_HEADS = 16  # query heads a thread block: mma's M
CHUNK_TOKENS = 64  # tokens a pipeline stage
HEAD_SIZES = (64, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
# ldmatrix, cp.async and bfloat16 mma.sync need sm_80.
MIN_COMPUTE_CAPABILITY = (8, 0)


def num_stages(head_size: int, tuning: DecodeTuning = DEFAULT_TUNING) -> int:
    return tuning.mma_stages or (2 if head_size > 128 else 3)


def shared_bytes(head_size: int, tuning: DecodeTuning = DEFAULT_TUNING) -> int:
    """MmaLayout<head_size>::kSharedBytes: the Q tile, then K and V of every stage."""
    stages = num_stages(head_size, tuning)
    return TILE_HEADS * head_size * 2 + 2 * stages * CHUNK_TOKENS * head_size * 2


def blocks_per_sm(head_size: int, tuning: DecodeTuning = DEFAULT_TUNING) -> int:
    """kMmaMinBlocks: the thread blocks an SM holds at shared_bytes (an H100 has 228 KB)."""
    if tuning.min_blocks_per_sm is not None:
        return tuning.min_blocks_per_sm
    return 4 if head_size <= 64 else 2 if head_size <= 128 else 1


def supports(
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_size: int,
    device: torch.device,
    shared_mem: int,
) -> bool:
    """16-bit activations and a cache of their dtype, a head size the kernels tile, and (on a GPU)
    sm_80 or newer with shared_mem bytes of shared memory for a block (sm_86 and sm_89 have 99 KB,
    short of the decode kernel's 100 KB at heads of 128); the emulator takes any CPU."""
    if dtype not in DTYPES or cache_dtype != dtype or head_size not in HEAD_SIZES:
        return False
    if device.type != "cuda":
        return True
    from pagedgen.kernels import loader

    index = torch.cuda.current_device() if device.index is None else device.index
    return (
        torch.cuda.get_device_capability(index) >= MIN_COMPUTE_CAPABILITY
        and loader.max_dynamic_shared_memory(index) >= shared_mem
    )


def num_tiles(group_size: int) -> int:
    return -(-group_size // TILE_HEADS)


def mma_module(
    dtype: torch.dtype, head_size: int, block_size: int, tuning: DecodeTuning = DEFAULT_TUNING
) -> KernelModule:
    c_type = C_TYPES[dtype]
    args = f"{c_type}, {head_size}, {block_size}"
    return KernelModule(
        source="paged_attention_mma.cu",
        defines=(
            f"PAGEDGEN_SCALAR_T={c_type}",
            f"PAGEDGEN_HEAD_SIZE={head_size}",
            f"PAGEDGEN_BLOCK_SIZE={block_size}",
            *tuning.mma_defines,
        ),
        name_expressions=(
            f"pagedgen::paged_attention_mma_v1_kernel<{args}>",
            f"pagedgen::paged_attention_mma_v2_kernel<{args}>",
        ),
    )


def mma_modules(head_sizes: tuple[int, ...], block_sizes: tuple[int, ...]) -> list[KernelModule]:
    """Every module the planner may pick, for those head and block sizes."""
    return [
        mma_module(dtype, head_size, block_size)
        for dtype in DTYPES
        for head_size in head_sizes
        if head_size in HEAD_SIZES
        for block_size in block_sizes
    ]


def mma_partition_size(
    max_context_len: int,
    num_work_blocks: int,
    head_size: int,
    num_sms: int,
    tuning: DecodeTuning = DEFAULT_TUNING,
) -> int | None:
    """The v2 partition size for num_work_blocks (kv head tile, sequence) pairs, or None for one
    pass (v1): fill_partition_size at the kernel's occupancy for head_size."""
    fill = blocks_per_sm(head_size, tuning) * num_sms
    return fill_partition_size(max_context_len, num_work_blocks, fill, PARTITION_SIZES)


def counters(device: torch.device, num_counters: int) -> torch.Tensor:
    """num_counters int32 zeros on device, which the v2 kernel leaves at zero: the newest of its
    buffers there, or a new one twice as large (old ones stay alive for graphs that use them)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    buffers = _counters.setdefault(device, [])
    if not buffers or buffers[-1].numel() < num_counters:
        size = max(MIN_COUNTERS, 2 * num_counters)
        buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]
