"""Compile-time knobs of the decode attention kernels, for benchmarks/sweep_decode.py: each is a
-D macro of kernels/paged_attention.cu and paged_attention_grouped.cu, whose defaults are the
kernels' own, so the default tuning compiles exactly the modules the engine runs."""

from typing import NamedTuple


class DecodeTuning(NamedTuple):
    num_threads: int = 128  # a thread block of the v1/v2 kernels (the v2 reduce keeps 128)
    min_blocks_per_sm: int | None = None  # __launch_bounds__' minimum: the register budget
    k_unroll: int | None = None  # grouped kernel: key vectors in flight a lane
    v_unroll: int | None = None  # grouped kernel: value tokens in flight a lane

    @property
    def defines(self) -> tuple[str, ...]:
        values = {
            "PAGEDGEN_DECODE_THREADS": None if self.num_threads == 128 else self.num_threads,
            "PAGEDGEN_DECODE_MIN_BLOCKS": self.min_blocks_per_sm,
            "PAGEDGEN_K_UNROLL": self.k_unroll,
            "PAGEDGEN_V_UNROLL": self.v_unroll,
        }
        return tuple(f"{name}={value}" for name, value in values.items() if value is not None)

    @property
    def label(self) -> str:
        parts = [f"{self.num_threads} threads"]
        if self.min_blocks_per_sm is not None:
            parts.append(f"{self.min_blocks_per_sm} blocks/SM")
        parts += [
            f"{kind} unroll {n}" for kind, n in (("k", self.k_unroll), ("v", self.v_unroll)) if n
        ]
        return ", ".join(parts)


DEFAULT_TUNING = DecodeTuning()

# What benchmarks/sweep_decode.py times, besides the default, per kernel: block sizes, register
# budgets and (grouped) loads in flight. tests/kernels/test_decode_tuning.py compiles every one.
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
}
