// bfloat16 matmul for CPUs with AVX512_BF16: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), x, W, bias
// and y in bfloat16, products summed in float32, y rounded once (to nearest even).
//
// W is packed once at load time into panels of 16 output columns whose rows hold pairs of k:
// [ceil(N / 16)][ceil(K / 2)][16][2] (zero-padded past N and K), so that one 64-byte row of a
// panel is the operand of one vdpbf16ps: acc[j] += x[k] * W[j, k] + x[k + 1] * W[j, k + 1] for
// the 16 columns j, with the pair (x[k], x[k + 1]) broadcast as one 32-bit word.
//
// The micro-kernel (bf16_dot.h) holds 6 rows x 4 panels (64 columns) of y in 24 zmm accumulators,
// or 12 rows x 2 panels; threads split the weight's quads of panels (pairs where a thread would
// have fewer than a dozen quads: gemm_unit_panels), each unit is read once for all rows of x (up
// to X_BLOCK_BYTES of them) and the first row tile prefetches the unit read next. On two Zen 4
// cores 6 x 4 runs 1.01-1.16x the 12 x 2 tiles on Llama-3.2-1B's shapes (fewer broadcasts of x,
// no row pointers spilled) and 1.0-1.3x oneDNN's bfloat16 kernels at 1-64 rows, about even at
// 512.
//
// Built with -march=native (pagedgen.kernels.cpu_build); where the target lacks AVX512_BF16,
// cpu_gemm_bf16_supported() returns 0 and the caller keeps oneDNN.

#include <stdint.h>
#include <string.h>

#include "cpu_gemm_loop.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define SUPPORTED 1
#include "bf16_dot.h"
#else
#define SUPPORTED 0
#define NR 16
#endif

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

// y: [m, n] contiguous; x: [m, k] bfloat16, rows ldx apart, each contiguous; w_packed from
// pack_weight_bf16; bias: [n] bfloat16 or NULL. Returns 0, or 1 where this build has no
// AVX512_BF16 kernel.
int linear_bf16(uint16_t *y, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                const uint16_t *bias, int64_t m, int64_t n, int64_t k, int num_threads) {
#if SUPPORTED
  const int64_t panels = (n + NR - 1) / NR;
  const int unit = gemm_unit_panels(panels, gemm_threads(num_threads, panels));
  const int64_t units = (panels + unit - 1) / unit, panel_elems = (k + 1) / 2 * NR * 2;
  const int64_t block_rows = gemm_block_rows(X_BLOCK_BYTES, k * (int64_t)sizeof(uint16_t), MR);
  const int64_t unit_bytes = unit * panel_elems * (int64_t)sizeof(uint16_t);
  GEMM_THREAD_LOOP(num_threads, units, unit_bytes, m, block_rows, {
    const uint16_t *next = q_next >= 0 ? w_packed + q_next * unit * panel_elems : NULL;
    dot_rows(y, n, x, ldx, w_packed + q * unit * panel_elems, k, bias, n, q, unit, panels, m0, m1,
             next);
  });
  return 0;
#else
  (void)y, (void)x, (void)ldx, (void)w_packed, (void)bias, (void)m, (void)n, (void)k;
  (void)num_threads;
  return 1;
#endif
}
