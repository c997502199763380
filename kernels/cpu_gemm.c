// Float32 matmul for AVX2 CPUs: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W packed once at load time
// into panels of 16 output columns, [ceil(N / 16)][K][16] (the last panel zero-padded), so the
// micro-kernel reads each panel row as two 8-float vectors.
//
// The micro-kernel holds a 6 x 16 tile of y in 12 ymm registers and, for each k, broadcasts
// x[r, k] for its 6 rows against the panel's row k: 12 FMAs per 2 vector loads and 6 broadcasts,
// so it runs near the FMA units' peak once the panel (K x 64 bytes) is in L1/L2. Threads split
// the panels; rows go in blocks of MB so a block of x stays in L2 across the panels. At M = 1 the
// same loop streams W once: bandwidth-bound, as it must be.
//
// Summation order, kept from oneDNN's AVX2 kernels so that results are bit-identical to
// torch.ops.mkldnn._linear_pointwise (the tests assert it): for each KC-wide slice of K, one
// sequential FMA chain from zero; the slices' sums added in order; then the bias.
//
// Built with -march=native (pagedgen.kernels.cpu_build); where the target lacks AVX2 or FMA,
// cpu_gemm_supported() returns 0 and the caller keeps oneDNN.

#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SUPPORTED 1
#else
#define SUPPORTED 0
#endif

#define NR 16    // output columns per panel: two ymm vectors
#define MR 6     // rows per micro-kernel call: 12 accumulators + 2 panel vectors + 1 broadcast
#define MB 48    // rows per block (a multiple of MR)
#define KC 1024  // K slice with its own FMA chain, as oneDNN's

int cpu_gemm_supported(void) { return SUPPORTED; }

// out: [ceil(n / NR)][k][NR], zero in the padding columns of the last panel.
int pack_weight(float *out, const float *w, int64_t n, int64_t k) {
  const int64_t panels = (n + NR - 1) / NR;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; p++) {
    float *panel = out + p * k * NR;
    for (int64_t j = 0; j < NR; j++) {
      const int64_t col = p * NR + j;
      for (int64_t i = 0; i < k; i++) panel[i * NR + j] = col < n ? w[col * k + i] : 0.0f;
    }
  }
  return 0;
}

#if SUPPORTED

#define DECLARE(r) __m256 c##r##0 = _mm256_setzero_ps(), c##r##1 = _mm256_setzero_ps();
#define FMA_ROW(r)                                             \
  if (ROWS > r) {                                              \
    const __m256 a = _mm256_broadcast_ss(x + r * ldx + i);     \
    c##r##0 = _mm256_fmadd_ps(a, b0, c##r##0);                 \
    c##r##1 = _mm256_fmadd_ps(a, b1, c##r##1);                 \
  }
// The first slice stores its sums; each later one adds them to what is there.
#define STORE_ROW(r)                                                                 \
  if (ROWS > r) {                                                                    \
    float *d = y + r * ldy;                                                          \
    if (accumulate) {                                                                \
      c##r##0 = _mm256_add_ps(_mm256_loadu_ps(d), c##r##0);                          \
      c##r##1 = _mm256_add_ps(_mm256_loadu_ps(d + 8), c##r##1);                      \
    }                                                                                \
    _mm256_storeu_ps(d, c##r##0);                                                    \
    _mm256_storeu_ps(d + 8, c##r##1);                                                \
  }

// y[r, 0:16] (+)= sum over i < kc of x[r, i] * panel[i, 0:16], for r < ROWS; y rows ldy apart.
#define KERNEL(R)                                                                              \
  static void kernel_##R(const float *x, int64_t ldx, const float *panel, int64_t kc, float *y, \
                         int64_t ldy, int accumulate) {                                        \
    enum { ROWS = R };                                                                         \
    DECLARE(0) DECLARE(1) DECLARE(2) DECLARE(3) DECLARE(4) DECLARE(5)                          \
    for (int64_t i = 0; i < kc; i++) {                                                         \
      const __m256 b0 = _mm256_loadu_ps(panel + i * NR);                                       \
      const __m256 b1 = _mm256_loadu_ps(panel + i * NR + 8);                                   \
      FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)                        \
    }                                                                                          \
    STORE_ROW(0) STORE_ROW(1) STORE_ROW(2) STORE_ROW(3) STORE_ROW(4) STORE_ROW(5)              \
  }
KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6)

typedef void (*Kernel)(const float *, int64_t, const float *, int64_t, float *, int64_t, int);
static const Kernel KERNELS[MR + 1] = {0, kernel_1, kernel_2, kernel_3,
                                       kernel_4, kernel_5, kernel_6};

// Rows [m0, m1) of y for one panel: each K slice in turn, then the bias. A partial last panel
// goes through a 6 x 16 scratch tile, so no store lands past column n.
static void panel_rows(float *y, const float *x, int64_t ldx, const float *panel,
                       const float *bias, int64_t m0, int64_t m1, int64_t n, int64_t k,
                       int64_t col) {
  const int64_t cols = n - col < NR ? n - col : NR;
  float tile[MR * NR];
  for (int64_t m = m0; m < m1; m += MR) {
    const int rows = m1 - m < MR ? (int)(m1 - m) : MR;
    float *dst = cols == NR ? y + m * n + col : tile;
    const int64_t ld = cols == NR ? n : NR;
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
      const int64_t kc = k - k0 < KC ? k - k0 : KC;
      KERNELS[rows](x + m * ldx + k0, ldx, panel + k0 * NR, kc, dst, ld, k0 > 0);
    }
    for (int r = 0; r < rows; r++) {
      float *out = y + (m + r) * n + col;
      if (cols < NR) memcpy(out, tile + r * NR, sizeof(float) * (size_t)cols);
      if (bias != NULL)
        for (int64_t j = 0; j < cols; j++) out[j] += bias[col + j];
    }
  }
}

#endif

// y: [m, n] contiguous; x: [m, k], rows ldx apart, each contiguous; w_packed from pack_weight;
// bias: [n] or NULL. Returns 0, or 1 where this build has no AVX2/FMA kernel.
int linear(float *y, const float *x, int64_t ldx, const float *w_packed, const float *bias,
           int64_t m, int64_t n, int64_t k, int num_threads) {
#if SUPPORTED
  const int64_t panels = (n + NR - 1) / NR;
  if (num_threads < 1) num_threads = 1;
  if (num_threads > panels) num_threads = (int)panels;
#pragma omp parallel num_threads(num_threads)
  {
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int64_t t = 0, nt = 1;
#endif
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
      const int64_t m1 = m0 + MB < m ? m0 + MB : m;
      for (int64_t p = p0; p < p1; p++)
        panel_rows(y, x, ldx, w_packed + p * k * NR, bias, m0, m1, n, k, p * NR);
    }
  }
  return 0;
#else
  (void)y, (void)x, (void)ldx, (void)w_packed, (void)bias, (void)m, (void)n, (void)k;
  (void)num_threads;
  return 1;
#endif
}
