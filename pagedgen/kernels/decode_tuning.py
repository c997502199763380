"""Compile-time knobs of the decode attention kernels, swept by benchmarks/sweep_decode.py: each
is a -D macro of kernels/paged_attention.cu and paged_attention_grouped.cu (`defines`) or of the
tensor-core kernels' decode_attend_mma.cuh (`mma_defines`), whose defaults are the kernels' own,
so the default tuning compiles exactly the modules the engine runs."""

from typing import NamedTuple


class DecodeTuning(NamedTuple):
    num_threads: int = 128  # a thread block of the v1/v2 kernels (the v2 reduce keeps 128)
    min_blocks_per_sm: int | None = None  # __launch_bounds__' minimum: the register budget
    k_unroll: int | None = None  # grouped kernel: key vectors in flight a lane
    v_unroll: int | None = None  # grouped kernel: value tokens in flight a lane
    mma_stages: int | None = None  # tensor-core kernel: K/V chunks of 64 tokens in shared memory

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
    def mma_defines(self) -> tuple[str, ...]:
        """The tensor-core kernel's: its stages and register budget (its threads are fixed)."""
        values = {
            "PAGEDGEN_MMA_STAGES": self.mma_stages,
            "PAGEDGEN_MMA_MIN_BLOCKS": self.min_blocks_per_sm,
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
        if self.mma_stages is not None:
            parts.append(f"{self.mma_stages} stages")
        return ", ".join(parts)


DEFAULT_TUNING = DecodeTuning()
