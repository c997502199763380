// The bfloat16 matmul on AMX tiles, its entry points: bfloat16 x (linear_bf16_amx) and float32 x
// in three bfloat16 parts (linear_f32_amx), over the panels cpu_gemm_bf16.c packs. amx_gemm.h holds
// the passes and says how they work.

#include "amx_gemm.h"

// Returns 0; 2 where k is not a multiple of 32; 3 where Linux grants no tiles.
int linear_bf16_amx(uint16_t *y, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                    const uint16_t *bias, int64_t m, int64_t n, int64_t k, int num_threads) {
  if (k % KB || k <= 0) return 2;
  if (request_tiles()) return 3;
  const Out o = {y, bias, NULL, NULL, n, k, n, 0};
  const int64_t block_rows = block_rows_for(m, k * (int64_t)sizeof(uint16_t), k);
  if (m > block_rows) return amx_prompt(&o, x, ldx, w_packed, NULL, NULL, m, num_threads);
  amx_linear(&o, x, ldx, w_packed, m, num_threads);
  return 0;
}

// Rows [0, rows) of x into parts[p][rows][k], p = 0, 1, 2: hi, mid and lo, each rounded to
// bfloat16 from what the ones before left (x - hi and x - hi - mid are exact in float32).
static void split_rows(uint16_t *parts, const float *x, int64_t ldx, int64_t rows, int64_t k,
                       int num_threads) {
  const int64_t stride = rows * k;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * k >= (1 << 16))
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t j = 0; j < k; j += 16) {
      __m512 rest = _mm512_loadu_ps(x + r * ldx + j);
      for (int p = 0; p < PARTS; p++) {
        const __m256i part = (__m256i)_mm512_cvtneps_pbh(rest);
        _mm256_storeu_si256((__m256i *)(parts + p * stride + r * k + j), part);
        const __m512i widened = _mm512_slli_epi32(_mm512_cvtepu16_epi32(part), 16);
        rest = _mm512_sub_ps(rest, _mm512_castsi512_ps(widened));
      }
    }
  }
}

// float32 y[M, N] = x[M, K] @ W^T (+ bias) over bfloat16 panels, x in three bfloat16 parts
// (see the top). Returns 0; 2 where k is not a multiple of 32; 3 where Linux grants no tiles; 4
// where no scratch memory is to be had.
int linear_f32_amx(float *y, const float *x, int64_t ldx, const uint16_t *w_packed,
                   const float *bias, int64_t m, int64_t n, int64_t k, int num_threads) {
  if (k % KB || k <= 0) return 2;
  if (request_tiles()) return 3;
  const int64_t rows = block_rows_for(m, PARTS * k * (int64_t)sizeof(uint16_t), k);
  uint16_t *parts = aligned_alloc(64, (size_t)(PARTS * rows * k) * sizeof(uint16_t));
  if (parts == NULL) return 4;
  for (int64_t m0 = 0; m0 < m; m0 += rows) {
    const int64_t mb = m0 + rows < m ? rows : m - m0;
    split_rows(parts, x + m0 * ldx, ldx, mb, k, num_threads);
    const Out o = {NULL, NULL, y + m0 * n, bias, n, k, n, mb * k};
    amx_linear(&o, parts, k, w_packed, mb, num_threads);
  }
  free(parts);
  return 0;
}
