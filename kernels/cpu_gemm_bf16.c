// bfloat16 matmul for CPUs with AVX512_BF16: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), x, W, bias
// and y in bfloat16, products summed in float32, y rounded once (to nearest even).
//
// W is packed once at load time into panels of 16 output columns whose rows hold pairs of k:
// [ceil(N / 16)][ceil(K / 2)][16][2] (zero-padded past N and K), so that one 64-byte row of a
// panel is the operand of one vdpbf16ps: acc[j] += x[k] * W[j, k] + x[k + 1] * W[j, k + 1] for
// the 16 columns j, with the pair (x[k], x[k + 1]) broadcast as one 32-bit word.
//
// The micro-kernel holds up to 12 rows x 2 panels (32 columns) of y in 24 zmm accumulators, as
// the float32 panel kernel (cpu_gemm.c) does; threads split the panel pairs, each pair is read
// once for all rows of x (up to X_BLOCK_BYTES of them) and the first row tile prefetches the pair
// read next. Where oneDNN's bfloat16 kernels reach ~65 % of the dot-product peak at decode batches
// (32-96 rows), this reaches ~85 %.
//
// Built with -march=native (pagedgen.kernels.cpu_build); where the target lacks AVX512_BF16,
// cpu_gemm_bf16_supported() returns 0 and the caller keeps oneDNN.

#include <stdint.h>
#include <string.h>

#include "cpu_gemm_loop.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define SUPPORTED 1
#else
#define SUPPORTED 0
#endif

#define NR 16                    // output columns per panel: one zmm of float32 sums
#define MR 12                    // rows per micro-kernel call
#define X_BLOCK_BYTES (4 << 20)  // x read per pass over W

int cpu_gemm_bf16_supported(void) { return SUPPORTED; }

// out: [ceil(n / NR)][ceil(k / 2)][NR][2] bfloat16 bits from w [n, k].
int pack_weight_bf16(uint16_t *out, const uint16_t *w, int64_t n, int64_t k) {
  const int64_t panels = (n + NR - 1) / NR, pairs = (k + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; p++) {
    uint16_t *panel = out + p * pairs * NR * 2;
    for (int64_t i = 0; i < pairs; i++)
      for (int64_t j = 0; j < NR; j++)
        for (int64_t h = 0; h < 2; h++) {
          const int64_t col = p * NR + j, kk = 2 * i + h;
          panel[(i * NR + j) * 2 + h] = col < n && kk < k ? w[col * k + kk] : 0;
        }
  }
  return 0;
}

#if SUPPORTED

// The pair (x[2i], x[2i + 1]) as one 32-bit word.
static inline __m512bh pair_at(const uint16_t *x, int64_t i) {
  int32_t word;
  memcpy(&word, x + 2 * i, sizeof word);
  return (__m512bh)_mm512_set1_epi32(word);
}

// acc[r][p] += x[r, 2i:2i+2] . panels[p][pair i], r < R, p < NP.
static inline __attribute__((always_inline)) void dot_pair(const uint16_t *x, int64_t ldx,
                                                           const uint16_t *panel,
                                                           int64_t panel_stride, int64_t i,
                                                           __m512 acc[MR][2], const int R,
                                                           const int NP, int odd_tail) {
  __m512bh b[2];
  for (int p = 0; p < NP; p++)
    b[p] = (__m512bh)_mm512_loadu_si512(panel + p * panel_stride + i * NR * 2);
  for (int r = 0; r < R; r++) {  // past an odd K, the pair (x[K - 1], 0)
    const __m512bh a =
        odd_tail ? (__m512bh)_mm512_set1_epi32((int32_t)x[r * ldx + 2 * i]) : pair_at(x + r * ldx, i);
    for (int p = 0; p < NP; p++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], a, b[p]);
  }
}

// acc[r][p] = sum over k of x[r, k] * panels[p][k, 0:16], r < R, p < NP.
static inline __attribute__((always_inline)) void kernel(const uint16_t *x, int64_t ldx,
                                                         const uint16_t *panel,
                                                         int64_t panel_stride, int64_t k,
                                                         const uint16_t *prefetch,
                                                         __m512 acc[MR][2], const int R,
                                                         const int NP) {
  for (int r = 0; r < R; r++)
    for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
  const int64_t whole = k / 2;
  for (int64_t i = 0; i < whole; i++) {
    if (prefetch) {
      _mm_prefetch((const char *)(prefetch + i * NR * 2), _MM_HINT_T1);
      if (NP == 2) _mm_prefetch((const char *)(prefetch + panel_stride + i * NR * 2), _MM_HINT_T1);
    }
    dot_pair(x, ldx, panel, panel_stride, i, acc, R, NP, 0);
  }
  if (k % 2) dot_pair(x, ldx, panel, panel_stride, whole, acc, R, NP, 1);
}

// Rows [m, m + R) of y for NP panels from column col: sums plus bias, rounded to bfloat16; columns
// past n are not stored.
#define TILE(R, NP)                                                                             \
  static void tile_##R##_##NP(uint16_t *y, const uint16_t *x, int64_t ldx,                    \
                              const uint16_t *panel, int64_t k, const uint16_t *bias, int64_t n, \
                              int64_t col, const uint16_t *prefetch) {                         \
    __m512 acc[MR][2];                                                                         \
    const int64_t panel_stride = (k + 1) / 2 * NR * 2;                                         \
    kernel(x, ldx, panel, panel_stride, k, prefetch, acc, R, NP);                              \
    for (int p = 0; p < NP; p++) {                                                             \
      const int64_t c0 = col + p * NR, cols = n - c0 < NR ? n - c0 : NR;                       \
      const __mmask16 mask = (__mmask16)((1u << cols) - 1);                                    \
      __m512 b = _mm512_setzero_ps();                                                          \
      if (bias != NULL)                                                                        \
        b = _mm512_castsi512_ps(_mm512_slli_epi32(                                             \
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + c0)), 16));            \
      for (int r = 0; r < R; r++) {                                                            \
        const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][p], b));                  \
        _mm256_mask_storeu_epi16(y + r * n + c0, mask, (__m256i)out);                          \
      }                                                                                        \
    }                                                                                          \
  }
#define TILES(NP)                                                                              \
  TILE(1, NP) TILE(2, NP) TILE(3, NP) TILE(4, NP) TILE(5, NP) TILE(6, NP) TILE(7, NP)          \
  TILE(8, NP) TILE(9, NP) TILE(10, NP) TILE(11, NP) TILE(12, NP)
TILES(1)
TILES(2)

typedef void (*Tile)(uint16_t *, const uint16_t *, int64_t, const uint16_t *, int64_t,
                     const uint16_t *, int64_t, int64_t, const uint16_t *);
#define TILE_ROW(NP)                                                                           \
  {0, tile_1_##NP, tile_2_##NP, tile_3_##NP, tile_4_##NP, tile_5_##NP, tile_6_##NP,           \
   tile_7_##NP, tile_8_##NP, tile_9_##NP, tile_10_##NP, tile_11_##NP, tile_12_##NP}
static const Tile TILES_BY_NP[2][MR + 1] = {TILE_ROW(1), TILE_ROW(2)};

#endif

// y: [m, n] contiguous; x: [m, k] bfloat16, rows ldx apart, each contiguous; w_packed from
// pack_weight_bf16; bias: [n] bfloat16 or NULL. Returns 0, or 1 where this build has no
// AVX512_BF16 kernel.
int linear_bf16(uint16_t *y, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                const uint16_t *bias, int64_t m, int64_t n, int64_t k, int num_threads) {
#if SUPPORTED
  const int64_t panels = (n + NR - 1) / NR, pairs = (panels + 1) / 2;
  const int64_t panel_elems = (k + 1) / 2 * NR * 2;
  const int64_t block_rows = gemm_block_rows(X_BLOCK_BYTES, k * (int64_t)sizeof(uint16_t), MR);
  const int64_t pair_bytes = 2 * panel_elems * (int64_t)sizeof(uint16_t);
  GEMM_THREAD_LOOP(num_threads, pairs, pair_bytes, m, block_rows, {
    const int np = panels - 2 * q < 2 ? 1 : 2;
    const uint16_t *panel = w_packed + 2 * q * panel_elems;
    for (int64_t r = m0; r < m1; r += MR) {
      const int rows = m1 - r < MR ? (int)(m1 - r) : MR;
      const uint16_t *next = r == m0 && q_next >= 0 ? w_packed + 2 * q_next * panel_elems : NULL;
      TILES_BY_NP[np - 1][rows](y + r * n, x + r * ldx, ldx, panel, k, bias, n, 2 * q * NR, next);
    }
  });
  return 0;
#else
  (void)y, (void)x, (void)ldx, (void)w_packed, (void)bias, (void)m, (void)n, (void)k;
  (void)num_threads;
  return 1;
#endif
}
