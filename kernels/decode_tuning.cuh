// The decode kernels' compile-time knobs, each overridable with -D for benchmarks/sweep_decode.py
// (pagedgen/kernels/decode_tuning.py); these defaults are what the engine compiles.
#pragma once

// Threads a block of the v1/v2 kernels (the per-head v2 reduce keeps 128).
#ifndef PAGEDGEN_DECODE_THREADS
#define PAGEDGEN_DECODE_THREADS 128
#endif
// The blocks an SM __launch_bounds__ budgets registers for.
#ifndef PAGEDGEN_DECODE_MIN_BLOCKS
#define PAGEDGEN_DECODE_MIN_BLOCKS 4
#endif
