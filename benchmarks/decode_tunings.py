"""The decode kernels' tunings benchmarks/sweep_decode.py times besides the default, per kernel.
tests/kernels/test_decode_tuning.py compiles every one."""

from pagedgen.kernels.decode_tuning import DecodeTuning

# Block sizes, register budgets and (grouped) loads in flight.
SWEEP = {
    "per-head": (
        DecodeTuning(64),
        DecodeTuning(256),
        DecodeTuning(min_blocks_per_sm=8),
        DecodeTuning(256, min_blocks_per_sm=2),
        DecodeTuning(64, min_blocks_per_sm=8),
    ),
    "grouped": (
        DecodeTuning(256),
        DecodeTuning(min_blocks_per_sm=2),
        DecodeTuning(min_blocks_per_sm=8),
        DecodeTuning(k_unroll=16, v_unroll=16),
        DecodeTuning(k_unroll=1, v_unroll=2),
        DecodeTuning(256, min_blocks_per_sm=2, k_unroll=16, v_unroll=16),
        DecodeTuning(64, min_blocks_per_sm=8),
    ),
    # Shared memory sets how many blocks an SM (227 KB) holds: at heads of 128, 3 stages (100 KB)
    # two, 2 stages (68 KB) three, 4 or 6 one; at heads of 64, 3 stages (50 KB) four, 2 six,
    # 4 (66 KB) three, 6 (98 KB) two. More blocks or more stages: more K/V bytes in flight.
    "mma": (
        DecodeTuning(mma_stages=2, min_blocks_per_sm=3),
        DecodeTuning(mma_stages=2),
        DecodeTuning(mma_stages=4, min_blocks_per_sm=3),
        DecodeTuning(mma_stages=6, min_blocks_per_sm=2),
        DecodeTuning(min_blocks_per_sm=1),
    ),
}
