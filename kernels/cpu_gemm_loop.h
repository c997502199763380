#pragma once
// The thread loop of the CPU matmuls (cpu_gemm.c, cpu_gemm_bf16.c, cpu_gemm_quant.c;
// cpu_gemm_amx.c writes it out to set up each thread's tiles first): OpenMP threads split W's
// units (runs of panels) into contiguous shares; each thread takes x in blocks of block_rows rows
// and, within a block, its units in order, so each unit is read once for all the block's rows.
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// Rows of x per pass over W: as many as x_block_bytes hold, a multiple of tile_rows (one at least).
static inline int64_t gemm_block_rows(int64_t x_block_bytes, int64_t row_bytes, int tile_rows) {
  const int64_t fit = x_block_bytes / row_bytes / tile_rows * tile_rows;
  return fit > tile_rows ? fit : tile_rows;
}

// Runs the statements after it for each unit q of this thread's share and rows [m0, m1) of x,
// on at most num_threads threads (one per unit at most). Where x takes several blocks, every
// block takes a chunk of the thread's units (GEMM_CHUNK_BYTES of W) before the next chunk, so a
// unit comes from memory once and from L3 for the later blocks, where W is more than L3 keeps
// (Llama-3-8B's gate/up: 235 MB). q_next: the unit read after q (-1: none), for a kernel that
// asks for it ahead.
#define GEMM_CHUNK_BYTES (2 << 20)
#ifdef _OPENMP
#define GEMM_THREAD_IDS const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads()
#else
#define GEMM_THREAD_IDS const int64_t t = 0, nt = 1
#endif
#define GEMM_THREAD_LOOP(num_threads, units, unit_bytes, m, block_rows, ...)                   \
  do {                                                                                       \
    int threads_ = (num_threads) < 1 ? 1 : (num_threads);                                    \
    if (threads_ > (units)) threads_ = (int)(units);                                         \
    _Pragma("omp parallel num_threads(threads_)") {                                          \
      GEMM_THREAD_IDS;                                                                       \
      const int64_t q0 = (units) * t / nt, q1 = (units) * (t + 1) / nt;                      \
      const int64_t chunk_ = (m) > (block_rows) ? GEMM_CHUNK_BYTES / (unit_bytes) + 1 : q1 - q0; \
      for (int64_t c0_ = q0; c0_ < q1; c0_ += chunk_) {                                      \
        const int64_t c1_ = c0_ + chunk_ < q1 ? c0_ + chunk_ : q1;                           \
        for (int64_t m0 = 0; m0 < (m); m0 += (block_rows)) {                                 \
          const int64_t m1 = m0 + (block_rows) < (m) ? m0 + (block_rows) : (m);              \
          for (int64_t q = c0_; q < c1_; q++) {                                              \
            const int64_t q_next = q + 1 < c1_ ? q + 1 : m1 < (m) ? c0_ : c1_ < q1 ? c1_ : -1; \
            (void)q_next;                                                                    \
            __VA_ARGS__                                                                      \
          }                                                                                  \
        }                                                                                    \
      }                                                                                      \
    }                                                                                        \
  } while (0)
