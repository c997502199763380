#pragma once
// The thread loops of the CPU matmuls (cpu_gemm.c, cpu_gemm_bf16.c, cpu_gemm_quant.c, and the AMX
// passes of amx_gemm.h inside parallel regions of their own): OpenMP threads split W's units (runs
// of panels) into contiguous shares; each thread takes x in blocks of block_rows rows and, within
// a block, its units in order, so each unit is read once for all the block's rows.
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// Rows of x per pass over W: as many as x_block_bytes hold, a multiple of tile_rows (one at least).
static inline int64_t gemm_block_rows(int64_t x_block_bytes, int64_t row_bytes, int tile_rows) {
  const int64_t fit = x_block_bytes / row_bytes / tile_rows * tile_rows;
  return fit > tile_rows ? fit : tile_rows;
}

// A thread's share of W's units in a call of one block of x (a decode batch): [front, back)
// packed in one word, its owner taking units from the front and a thread done with its own from
// the back, one at a time (compare-and-swap: each unit goes to one thread, and a unit's outputs
// do not depend on which), so that the threads end together however their speeds differ on a
// shared machine.
#define GEMM_MAX_THREADS 256
static inline uint64_t gemm_share(int64_t front, int64_t back) {
  return (uint64_t)front | (uint64_t)back << 32;
}

// Equal contiguous shares of units for threads threads.
static inline void gemm_shares(uint64_t *shares, int64_t units, int threads) {
  for (int t = 0; t < threads; t++)
    shares[t] = gemm_share(units * t / threads, units * (t + 1) / threads);
}

// The unit taken from share's front (from_back 0) or back, or -1 where none is left.
static inline int64_t gemm_take(uint64_t *share, int from_back) {
  uint64_t old = __atomic_load_n(share, __ATOMIC_RELAXED);
  for (;;) {
    const int64_t front = (uint32_t)old, back = (uint32_t)(old >> 32);
    if (front >= back) return -1;
    const uint64_t taken = from_back ? gemm_share(front, back - 1) : gemm_share(front + 1, back);
    if (__atomic_compare_exchange_n(share, &old, taken, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return from_back ? back - 1 : front;
  }
}

// The unit the thread taking from share's front (or back) would take next, or -1 for none.
static inline int64_t gemm_after(const uint64_t *share, int from_back) {
  const uint64_t now = __atomic_load_n(share, __ATOMIC_RELAXED);
  const int64_t front = (uint32_t)now, back = (uint32_t)(now >> 32);
  return front >= back ? -1 : from_back ? back - 1 : front;
}

// Threads a call over units takes: num_threads (one at least), one per unit at most.
static inline int gemm_threads(int num_threads, int64_t units) {
  int threads = num_threads < 1 ? 1 : num_threads;
  if (threads > units) threads = (int)units;
  return threads > GEMM_MAX_THREADS ? GEMM_MAX_THREADS : threads;
}

// Panels per unit of work of the AVX-512 panel kernels (cpu_gemm.c, bf16_dot.h) for a weight of
// `panels` panels on `threads` threads: quads (6 x 4 tiles) where each thread has a dozen or more
// of them, else pairs (12 x 2 tiles): a call over a narrow weight (SmolLM2's 576 columns: 9
// quads) would end with one thread a quad behind the other (0.93-0.96x at 54-61 rows, Zen 4).
static inline int gemm_unit_panels(int64_t panels, int threads) {
  return (panels + 3) / 4 >= 12 * (int64_t)threads ? 4 : 2;
}

#define GEMM_CHUNK_BYTES (2 << 20)

// Units of a chunk: GEMM_CHUNK_BYTES of W, and one more.
static inline int64_t gemm_chunk_units(int64_t unit_bytes) {
  return GEMM_CHUNK_BYTES / unit_bytes + 1;
}
#ifdef _OPENMP
#define GEMM_THREAD_IDS const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads()
#else
#define GEMM_THREAD_IDS const int64_t t = 0, nt = 1
#endif

// Inside a parallel region: runs the statements after it for each chunk of units [chunk0,
// chunk1) (gemm_chunk_units) of this thread's contiguous share, in order; chunk_after: the next
// chunk's first unit (-1: none).
#define GEMM_CHUNKS(units, unit_bytes, ...)                                                  \
  do {                                                                                       \
    GEMM_THREAD_IDS;                                                                         \
    const int64_t q0_ = (units) * t / nt, q1_ = (units) * (t + 1) / nt;                      \
    const int64_t chunk_ = gemm_chunk_units(unit_bytes);                                     \
    for (int64_t chunk0 = q0_; chunk0 < q1_; chunk0 += chunk_) {                             \
      const int64_t chunk1 = chunk0 + chunk_ < q1_ ? chunk0 + chunk_ : q1_;                  \
      const int64_t chunk_after = chunk1 < q1_ ? chunk1 : -1;                                \
      (void)chunk_after;                                                                     \
      __VA_ARGS__                                                                            \
    }                                                                                        \
  } while (0)

// Inside a parallel region of `threads` threads (shares from gemm_shares): runs the statements
// after it for each unit q this thread takes and rows [m0, m1) of x. x of one block: the thread
// takes its share's units, then the others' (see gemm_take). x of several blocks: it takes its
// share, every block taking a chunk of the share's units (GEMM_CHUNK_BYTES of W) before the next
// chunk, so a unit comes from memory once and from L3 for the later blocks, where W is more than
// L3 keeps (Llama-3-8B's gate/up: 235 MB). CHUNK, an expression, runs as each chunk of units
// [chunk0, chunk1) begins (one unit taken from a share is a chunk of its own). q_next: the unit
// read after q (-1: none), for a kernel that asks for it ahead.
#define GEMM_UNITS(units, unit_bytes, m, block_rows, shares, threads, CHUNK, ...)             \
  do {                                                                                       \
    GEMM_THREAD_IDS;                                                                         \
    if ((m) <= (block_rows) && nt == (threads)) {                                            \
      const int64_t m0 = 0, m1 = (m);                                                        \
      for (int u_ = 0; u_ < nt; u_++) {                                                      \
        uint64_t *share_ = &(shares)[(t + u_) % nt];                                         \
        for (int64_t q; (q = gemm_take(share_, u_ > 0)) >= 0;) {                             \
          const int64_t chunk0 = q, chunk1 = q + 1, q_next = gemm_after(share_, u_ > 0);     \
          (void)chunk0, (void)chunk1, (void)q_next, (void)m0, (void)m1;                      \
          CHUNK;                                                                             \
          __VA_ARGS__                                                                        \
        }                                                                                    \
      }                                                                                      \
    } else {                                                                                 \
      GEMM_CHUNKS(units, unit_bytes, {                                                       \
        CHUNK;                                                                               \
        for (int64_t m0 = 0; m0 < (m); m0 += (block_rows)) {                                 \
          const int64_t m1 = m0 + (block_rows) < (m) ? m0 + (block_rows) : (m);              \
          for (int64_t q = chunk0; q < chunk1; q++) {                                        \
            const int64_t q_next = q + 1 < chunk1 ? q + 1 : m1 < (m) ? chunk0 : chunk_after; \
            (void)q_next;                                                                    \
            __VA_ARGS__                                                                      \
          }                                                                                  \
        }                                                                                    \
      });                                                                                    \
    }                                                                                        \
  } while (0)

// GEMM_UNITS over units on at most num_threads threads of a region of its own.
#define GEMM_THREAD_LOOP(num_threads, units, unit_bytes, m, block_rows, ...)                   \
  do {                                                                                       \
    const int threads_ = gemm_threads((num_threads), (units));                               \
    uint64_t shares_[GEMM_MAX_THREADS];                                                      \
    gemm_shares(shares_, (units), threads_);                                                 \
    _Pragma("omp parallel num_threads(threads_)")                                            \
        GEMM_UNITS(units, unit_bytes, m, block_rows, shares_, threads_, (void)0, __VA_ARGS__); \
  } while (0)
