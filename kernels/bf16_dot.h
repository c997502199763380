#pragma once
// The AVX512_BF16 dot-product micro-kernel over bfloat16 panels ([K / 2][16][2] a panel, as
// cpu_gemm_bf16.c packs them): up to MR4 rows of x against three or four panels (64 columns) of W,
// or up to MR rows against one or two, the sums of y in at most 24 zmm accumulators, each
// column's products summed over the pairs of k in order (so a row's outputs never depend on the
// rows beside it, nor on the tile it falls in), then plus bias, rounded once to bfloat16.
// cpu_gemm_bf16.c runs it over packed weights, cpu_gemm_quant_bf16.c over quantized weights it
// dequantizes a quad of panels at a time. Include where __AVX512BF16__ is defined.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define NR 16  // output columns per panel: one zmm of float32 sums
#define MR 12  // rows per micro-kernel call over one or two panels
#define MR4 6  // ... over three or four

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
                                                           __m512 acc[MR][4], const int R,
                                                           const int NP, int odd_tail) {
  __m512bh b[4];
  for (int p = 0; p < NP; p++)
    b[p] = (__m512bh)_mm512_loadu_si512(panel + p * panel_stride + i * NR * 2);
  for (int r = 0; r < R; r++) {  // past an odd K, the pair (x[K - 1], 0)
    const __m512bh a =
        odd_tail ? (__m512bh)_mm512_set1_epi32((int32_t)x[r * ldx + 2 * i]) : pair_at(x + r * ldx, i);
    for (int p = 0; p < NP; p++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], a, b[p]);
  }
}

// acc[r][p] = sum over k of x[r, k] * panels[p][k, 0:16], r < R, p < NP.
static inline __attribute__((always_inline)) void dot_panels(const uint16_t *x, int64_t ldx,
                                                         const uint16_t *panel,
                                                         int64_t panel_stride, int64_t k,
                                                         const uint16_t *prefetch,
                                                         __m512 acc[MR][4], const int R,
                                                         const int NP) {
  for (int r = 0; r < R; r++)
    for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
  const int64_t whole = k / 2;
  for (int64_t i = 0; i < whole; i++) {
    if (prefetch) {
      for (int p = 0; p < NP; p++)
        _mm_prefetch((const char *)(prefetch + p * panel_stride + i * NR * 2), _MM_HINT_T1);
    }
    dot_pair(x, ldx, panel, panel_stride, i, acc, R, NP, 0);
  }
  if (k % 2) dot_pair(x, ldx, panel, panel_stride, whole, acc, R, NP, 1);
}

// Rows [m, m + R) of y for NP panels from column col: sums plus bias, rounded to bfloat16; columns
// past n are not stored.
#define DOT_TILE(R, NP)                                                                           \
  static void dot_##R##_##NP(uint16_t *y, int64_t ldy, const uint16_t *x, int64_t ldx,       \
                              const uint16_t *panel, int64_t k, const uint16_t *bias, int64_t n, \
                              int64_t col, const uint16_t *prefetch) {                         \
    __m512 acc[MR][4];                                                                         \
    const int64_t panel_stride = (k + 1) / 2 * NR * 2;                                         \
    dot_panels(x, ldx, panel, panel_stride, k, prefetch, acc, R, NP);                          \
    for (int p = 0; p < NP; p++) {                                                             \
      const int64_t c0 = col + p * NR, cols = n - c0 < NR ? n - c0 : NR;                       \
      const __mmask16 mask = (__mmask16)((1u << cols) - 1);                                    \
      __m512 b = _mm512_setzero_ps();                                                          \
      if (bias != NULL)                                                                        \
        b = _mm512_castsi512_ps(_mm512_slli_epi32(                                             \
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + c0)), 16));            \
      for (int r = 0; r < R; r++) {                                                            \
        const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][p], b));                  \
        _mm256_mask_storeu_epi16(y + r * ldy + c0, mask, (__m256i)out);                          \
      }                                                                                        \
    }                                                                                          \
  }
#define DOT_TILES(NP)                                                                              \
  DOT_TILE(1, NP) DOT_TILE(2, NP) DOT_TILE(3, NP) DOT_TILE(4, NP) DOT_TILE(5, NP) DOT_TILE(6, NP) \
  DOT_TILE(7, NP) DOT_TILE(8, NP) DOT_TILE(9, NP) DOT_TILE(10, NP) DOT_TILE(11, NP)               \
  DOT_TILE(12, NP)
DOT_TILES(1)
DOT_TILES(2)
#define DOT_TILES4(NP)                                                                          \
  DOT_TILE(1, NP) DOT_TILE(2, NP) DOT_TILE(3, NP) DOT_TILE(4, NP) DOT_TILE(5, NP) DOT_TILE(6, NP)
DOT_TILES4(3)
DOT_TILES4(4)

typedef void (*DotTile)(uint16_t *, int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t,
                     const uint16_t *, int64_t, int64_t, const uint16_t *);
#define DOT_ROW(NP)                                                                            \
  {0, dot_1_##NP, dot_2_##NP, dot_3_##NP, dot_4_##NP, dot_5_##NP, dot_6_##NP, dot_7_##NP,    \
   dot_8_##NP, dot_9_##NP, dot_10_##NP, dot_11_##NP, dot_12_##NP}
// DOT_TILES_BY_NP[np - 1][rows](y, ldy, x, ldx, panel, k, bias, n, col, prefetch): rows (1..MR)
// of y from column col for np panels; prefetch: np panels read next, asked into L2 (or NULL).
static const DotTile DOT_TILES_BY_NP[2][MR + 1] = {DOT_ROW(1), DOT_ROW(2)};
#define DOT_ROW4(NP) {0, dot_1_##NP, dot_2_##NP, dot_3_##NP, dot_4_##NP, dot_5_##NP, dot_6_##NP}
static const DotTile DOT_TILES4_BY_NP[2][MR4 + 1] = {DOT_ROW4(3), DOT_ROW4(4)};

// Rows [m0, m1) of y for unit q of the weight's panels (`unit` of them, 2 or 4: fewer in the last
// unit), whose first panel is at panel: 6 rows a call (24 sums) over three or four panels, 12
// over one or two. prefetch: the unit read next, asked into L2 by the first call (or NULL).
static inline void dot_rows(uint16_t *y, int64_t ldy, const uint16_t *x, int64_t ldx,
                            const uint16_t *panel, int64_t k, const uint16_t *bias, int64_t n,
                            int64_t q, int unit, int64_t panels, int64_t m0, int64_t m1,
                            const uint16_t *prefetch) {
  const int64_t p0 = q * unit;
  const int np = panels - p0 < unit ? (int)(panels - p0) : unit, mr = np > 2 ? MR4 : MR;
  for (int64_t r = m0; r < m1; r += mr) {
    const int rows = m1 - r < mr ? (int)(m1 - r) : mr;
    const DotTile tile = np > 2 ? DOT_TILES4_BY_NP[np - 3][rows] : DOT_TILES_BY_NP[np - 1][rows];
    tile(y + r * ldy, ldy, x + r * ldx, ldx, panel, k, bias, n, p0 * NR,
         r == m0 ? prefetch : NULL);
  }
}
