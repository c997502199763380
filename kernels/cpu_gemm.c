// Float32 matmul for AVX2 and AVX-512 CPUs: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), W packed once
// at load time into panels of 16 output columns, [ceil(N / 16)][K][16] (the last panel
// zero-padded), so the micro-kernel reads each panel row as two 8-float vectors (AVX2) or one
// 16-float vector (AVX-512, which takes two panels side by side: see PANEL_ROWS512).
//
// The micro-kernel holds a 6 x 16 tile of y in 12 ymm registers and, for each k, broadcasts
// x[r, k] for its 6 rows against the panel's row k: 12 FMAs per 2 vector loads and 6 broadcasts,
// so it runs near the FMA units' peak once the panel (K x 64 bytes) is in L1/L2. Threads split
// the panels. Each panel is read from memory once for all rows of x (up to X_BLOCK_BYTES of them,
// which then come from L2/L3 for each panel: 8 FLOPs per byte of x), and the first row tile of a
// panel prefetches the next panel, one 64-byte line per k, so the stream of W overlaps the FMAs.
// At M = 1 the same loop streams W once: bandwidth-bound, as it must be.
//
// Summation order, kept from oneDNN's kernels for the same ISA so that results are bit-identical
// to torch.ops.mkldnn._linear_pointwise (the tests assert it): for each KC-wide slice of K, one
// sequential FMA chain from zero; the slices' sums added in order; then the bias. oneDNN's AVX2
// kernels slice by 1024; its AVX-512 ones as kc512() says.
//
// A bfloat16 weight packs into the same panels at 2 bytes an element and is widened to float32 as
// it is loaded (exactly: a shift), so a bfloat16 model reads half the bytes and computes what the
// float32 kernel computes over the widened weight, bit for bit.
//
// Built with -march=native (pagedgen.kernels.cpu_build); where the target lacks AVX2 or FMA,
// cpu_gemm_supported() returns 0 and the caller keeps oneDNN.

#include <stdint.h>
#include <string.h>

#include "cpu_gemm_loop.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SUPPORTED 1
#else
#define SUPPORTED 0
#endif

#define NR 16    // output columns per panel: two ymm vectors
#define MR 6     // rows per micro-kernel call: 12 accumulators + 2 panel vectors + 1 broadcast
#define X_BLOCK_BYTES (4 << 20)  // x read per pass over W: each pass reads all of W from memory
#define KC 1024  // K slice with its own FMA chain, as oneDNN's

int cpu_gemm_supported(void) { return SUPPORTED; }

// After a row tile's K slices: the rows that went through the scratch tile (the last panel's,
// cols < width) copied out, then the bias added.
static inline void finish_rows(float *y, int64_t ldy, const float *tile, int64_t width, int rows,
                               int64_t cols, const float *bias) {
  for (int r = 0; r < rows; r++) {
    float *out = y + r * ldy;
    if (cols < width) memcpy(out, tile + r * width, sizeof(float) * (size_t)cols);
    if (bias != NULL)
      for (int64_t j = 0; j < cols; j++) out[j] += bias[j];
  }
}


// out: [ceil(n / NR)][k][NR], zero in the padding columns of the last panel; elements of
// elem_size bytes (4: float32, 2: bfloat16), copied as they are. Each panel is written in order,
// reading its 16 weight rows side by side.
#define PACK(T)                                                                                \
  static void pack_##T(T *out, const T *w, int64_t n, int64_t k) {                             \
    const int64_t panels = (n + NR - 1) / NR;                                                  \
    _Pragma("omp parallel for schedule(static)") for (int64_t p = 0; p < panels; p++) {        \
      T *panel = out + p * k * NR;                                                             \
      const int64_t cols = n - p * NR < NR ? n - p * NR : NR;                                  \
      const T *rows = w + p * NR * k;                                                          \
      for (int64_t i = 0; i < k; i++) {                                                        \
        for (int64_t j = 0; j < cols; j++) panel[i * NR + j] = rows[j * k + i];                \
        for (int64_t j = cols; j < NR; j++) panel[i * NR + j] = 0;                             \
      }                                                                                        \
    }                                                                                          \
  }
PACK(uint32_t)
PACK(uint16_t)

int pack_weight(void *out, const void *w, int64_t n, int64_t k, int elem_size) {
  if (elem_size == 4)
    pack_uint32_t((uint32_t *)out, (const uint32_t *)w, n, k);
  else if (elem_size == 2)
    pack_uint16_t((uint16_t *)out, (const uint16_t *)w, n, k);
  else
    return 1;
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

static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t *p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// y[r, 0:16] (+)= sum over i < kc of x[r, i] * panel[i, 0:16], for r < ROWS; y rows ldy apart.
#define KERNEL(W, R)                                                                           \
  static void kernel_##W##_##R(const float *x, int64_t ldx, const W##_t *panel, int64_t kc,   \
                               float *y, int64_t ldy, int accumulate,                         \
                               const W##_t *prefetch) {                                        \
    enum { ROWS = R };                                                                         \
    DECLARE(0) DECLARE(1) DECLARE(2) DECLARE(3) DECLARE(4) DECLARE(5)                          \
    for (int64_t i = 0; i < kc; i++) {                                                         \
      if (prefetch) _mm_prefetch((const char *)(prefetch + i * NR), _MM_HINT_T1);              \
      const __m256 b0 = load8_##W(panel + i * NR);                                             \
      const __m256 b1 = load8_##W(panel + i * NR + 8);                                         \
      FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)                        \
    }                                                                                          \
    STORE_ROW(0) STORE_ROW(1) STORE_ROW(2) STORE_ROW(3) STORE_ROW(4) STORE_ROW(5)              \
  }

// Rows [m0, m1) of y for one panel: each K slice in turn, then the bias. A partial last panel
// goes through a 6 x 16 scratch tile, so no store lands past column n. The first row tile
// prefetches the panel after this one (past the last panel too: a prefetch never faults).
#define PANEL_ROWS(W)                                                                          \
  KERNEL(W, 1) KERNEL(W, 2) KERNEL(W, 3) KERNEL(W, 4) KERNEL(W, 5) KERNEL(W, 6)                \
  typedef void (*Kernel_##W)(const float *, int64_t, const W##_t *, int64_t, float *, int64_t, \
                             int, const W##_t *);                                                             \
  static const Kernel_##W KERNELS_##W[MR + 1] = {0,            kernel_##W##_1, kernel_##W##_2, \
                                                 kernel_##W##_3, kernel_##W##_4, kernel_##W##_5, \
                                                 kernel_##W##_6};                              \
  static void panel_rows_##W(float *y, const float *x, int64_t ldx, const W##_t *panel,        \
                             const float *bias, int64_t m0, int64_t m1, int64_t n, int64_t k,  \
                             int64_t col) {                                                    \
    const int64_t cols = n - col < NR ? n - col : NR;                                          \
    float tile[MR * NR];                                                                       \
    for (int64_t m = m0; m < m1; m += MR) {                                                    \
      const int rows = m1 - m < MR ? (int)(m1 - m) : MR;                                       \
      float *dst = cols == NR ? y + m * n + col : tile;                                        \
      const int64_t ld = cols == NR ? n : NR;                                                  \
      for (int64_t k0 = 0; k0 < k; k0 += KC) {                                                 \
        const int64_t kc = k - k0 < KC ? k - k0 : KC;                                          \
        const W##_t *next = m == m0 ? panel + (k + k0) * NR : NULL;                          \
        KERNELS_##W[rows](x + m * ldx + k0, ldx, panel + k0 * NR, kc, dst, ld, k0 > 0, next);  \
      }                                                                                        \
      finish_rows(y + m * n + col, n, tile, NR, rows, cols, bias == NULL ? NULL : bias + col); \
    }                                                                                          \
  }

typedef float f32_t;
typedef uint16_t bf16_t;

#if !defined(__AVX512F__)
PANEL_ROWS(f32)
PANEL_ROWS(bf16)

// A thread's unit of work: one panel, for rows [m0, m1).
#define TILE_ROWS MR
static inline int unit_panels(int64_t panels, int threads) {
  (void)panels, (void)threads;
  return 1;
}
static inline void unit_rows(float *y, const float *x, int64_t ldx, const void *w_packed,
                             int weight_bf16, const float *bias, int64_t m0, int64_t m1,
                             int64_t m, int64_t n, int64_t k, int64_t p, int64_t panels,
                             int unit) {
  (void)m, (void)panels, (void)unit;
  if (weight_bf16)
    panel_rows_bf16(y, x, ldx, (const bf16_t *)w_packed + p * k * NR, bias, m0, m1, n, k, p * NR);
  else
    panel_rows_f32(y, x, ldx, (const f32_t *)w_packed + p * k * NR, bias, m0, m1, n, k, p * NR);
}
#else
// AVX-512: the same panels, four side by side (64 columns) against up to 6 rows, or two against
// up to 12 where a unit has two left: 24 zmm accumulators, the panel vectors and a broadcast of
// the 32 registers. oneDNN slices K by 512 where K <= 1024 or there is one row, else by
// 1024 (measured on an AVX-512 Zen 5; its one-row kernel splits K past 1536 its own way, so
// there a result may differ from oneDNN's in the last bit).
#define MR512 12  // rows a call over one or two panels
#define MR512_4 6  // ... over three or four (24 accumulators either way)

static inline __m512 load16_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_bf16(const uint16_t *p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static inline int64_t kc512(int64_t m, int64_t k) { return m == 1 || k <= 1024 ? 512 : 1024; }

// y[r, 0:16 * NP] (+)= sum over i < kc of x[r, i] * panels[p][i, 0:16], r < R, p < NP; panel p
// starts panel_stride elements after panel p - 1.
#define KERNEL512(W)                                                                           \
  static inline __attribute__((always_inline)) void kernel512_##W(                            \
      const float *x, int64_t ldx, const W##_t *panel, int64_t panel_stride, int64_t kc,      \
      float *y, int64_t ldy, int accumulate, const W##_t *prefetch, const int R, const int NP) { \
    __m512 c[MR512][4];                                                                        \
    for (int r = 0; r < R; r++)                                                                \
      for (int p = 0; p < NP; p++) c[r][p] = _mm512_setzero_ps();                              \
    for (int64_t i = 0; i < kc; i++) {                                                         \
      if (prefetch) {                                                                          \
        for (int p = 0; p < NP; p++)                                                           \
          _mm_prefetch((const char *)(prefetch + p * panel_stride + i * NR), _MM_HINT_T1);     \
      }                                                                                        \
      __m512 b[4];                                                                             \
      for (int p = 0; p < NP; p++) b[p] = load16_##W(panel + p * panel_stride + i * NR);      \
      for (int r = 0; r < R; r++) {                                                            \
        const __m512 a = _mm512_set1_ps(x[r * ldx + i]);                                       \
        for (int p = 0; p < NP; p++) c[r][p] = _mm512_fmadd_ps(a, b[p], c[r][p]);              \
      }                                                                                        \
    }                                                                                          \
    for (int r = 0; r < R; r++)                                                                \
      for (int p = 0; p < NP; p++) {                                                           \
        float *d = y + r * ldy + p * NR;                                                       \
        _mm512_storeu_ps(d, accumulate ? _mm512_add_ps(_mm512_loadu_ps(d), c[r][p]) : c[r][p]); \
      }                                                                                        \
  }
#define KERNEL512_RN(W, R, NP)                                                                   \
  static void kernel512_##W##_##R##_##NP(const float *x, int64_t ldx, const W##_t *panel,       \
                                         int64_t panel_stride, int64_t kc, float *y, int64_t ldy, \
                                         int accumulate, const W##_t *prefetch) {               \
    kernel512_##W(x, ldx, panel, panel_stride, kc, y, ldy, accumulate, prefetch, R, NP);        \
  }
#define KERNELS512_NP(W, NP)                                                                    \
  KERNEL512_RN(W, 1, NP) KERNEL512_RN(W, 2, NP) KERNEL512_RN(W, 3, NP) KERNEL512_RN(W, 4, NP) \
  KERNEL512_RN(W, 5, NP) KERNEL512_RN(W, 6, NP) KERNEL512_RN(W, 7, NP) KERNEL512_RN(W, 8, NP) \
  KERNEL512_RN(W, 9, NP) KERNEL512_RN(W, 10, NP) KERNEL512_RN(W, 11, NP)                      \
  KERNEL512_RN(W, 12, NP)
#define KERNELS512_NP4(W, NP)                                                                   \
  KERNEL512_RN(W, 1, NP) KERNEL512_RN(W, 2, NP) KERNEL512_RN(W, 3, NP) KERNEL512_RN(W, 4, NP) \
  KERNEL512_RN(W, 5, NP) KERNEL512_RN(W, 6, NP)
#define KERNEL512_ROW4(W, NP)                                                                   \
  {0, kernel512_##W##_1_##NP, kernel512_##W##_2_##NP, kernel512_##W##_3_##NP,                  \
   kernel512_##W##_4_##NP, kernel512_##W##_5_##NP, kernel512_##W##_6_##NP}
#define KERNEL512_ROW(W, NP)                                                                    \
  {0, kernel512_##W##_1_##NP, kernel512_##W##_2_##NP, kernel512_##W##_3_##NP,                  \
   kernel512_##W##_4_##NP, kernel512_##W##_5_##NP, kernel512_##W##_6_##NP,                     \
   kernel512_##W##_7_##NP, kernel512_##W##_8_##NP, kernel512_##W##_9_##NP,                     \
   kernel512_##W##_10_##NP, kernel512_##W##_11_##NP, kernel512_##W##_12_##NP}

// Rows [m0, m1) of y for np (1 to 4) panels from column col, 12 rows a call over one or two
// panels and 6 over three or four: each K slice in turn, then the bias. Columns past n go
// through a scratch tile (12 x 32 or 6 x 64).
#define PANEL_ROWS512(W)                                                                       \
  KERNEL512(W) KERNELS512_NP(W, 1) KERNELS512_NP(W, 2) KERNELS512_NP4(W, 3) KERNELS512_NP4(W, 4) \
  typedef void (*Kernel512_##W)(const float *, int64_t, const W##_t *, int64_t, int64_t,      \
                                float *, int64_t, int, const W##_t *);                         \
  static const Kernel512_##W KERNELS512_##W[2][MR512 + 1] = {KERNEL512_ROW(W, 1),             \
                                                             KERNEL512_ROW(W, 2)};            \
  static const Kernel512_##W KERNELS512_4_##W[2][MR512_4 + 1] = {KERNEL512_ROW4(W, 3),        \
                                                                 KERNEL512_ROW4(W, 4)};       \
  static void panel_rows512_##W(float *y, const float *x, int64_t ldx, const W##_t *panel,     \
                                int np, const float *bias, int64_t m0, int64_t m1, int64_t n,  \
                                int64_t k, int64_t kc_max, int64_t col) {                      \
    const int64_t width = np * NR, cols = n - col < width ? n - col : width;                   \
    const int mr = np > 2 ? MR512_4 : MR512;                                                   \
    float tile[MR512 * 2 * NR];                                                                \
    for (int64_t m = m0; m < m1; m += mr) {                                                    \
      const int rows = m1 - m < mr ? (int)(m1 - m) : mr;                                       \
      float *dst = cols == width ? y + m * n + col : tile;                                     \
      const int64_t ld = cols == width ? n : width;                                            \
      for (int64_t k0 = 0; k0 < k; k0 += kc_max) {                                            \
        const int64_t kc = k - k0 < kc_max ? k - k0 : kc_max;                                  \
        const W##_t *next = m == m0 ? panel + np * k * NR + k0 * NR : NULL;                    \
        const Kernel512_##W kernel =                                                           \
            np > 2 ? KERNELS512_4_##W[np - 3][rows] : KERNELS512_##W[np - 1][rows];            \
        kernel(x + m * ldx + k0, ldx, panel + k0 * NR, k * NR, kc, dst, ld, k0 > 0, next);     \
      }                                                                                        \
      finish_rows(y + m * n + col, n, tile, width, rows, cols, bias == NULL ? NULL : bias + col); \
    }                                                                                          \
  }
PANEL_ROWS512(f32)
PANEL_ROWS512(bf16)

// A thread's unit of work: `unit` panels from p (fewer if they are the last), for rows [m0, m1):
// four (6 x 4 tiles) or two (12 x 2) as gemm_unit_panels says.
#define TILE_ROWS MR512
static inline int unit_panels(int64_t panels, int threads) {
  return gemm_unit_panels(panels, threads);
}
static inline void unit_rows(float *y, const float *x, int64_t ldx, const void *w_packed,
                             int weight_bf16, const float *bias, int64_t m0, int64_t m1,
                             int64_t m, int64_t n, int64_t k, int64_t p, int64_t panels,
                             int unit) {
  const int np = panels - p < unit ? (int)(panels - p) : unit;
  if (weight_bf16)
    panel_rows512_bf16(y, x, ldx, (const bf16_t *)w_packed + p * k * NR, np, bias, m0, m1, n, k,
                       kc512(m, k), p * NR);
  else
    panel_rows512_f32(y, x, ldx, (const f32_t *)w_packed + p * k * NR, np, bias, m0, m1, n, k,
                      kc512(m, k), p * NR);
}
#endif

#endif

// y: [m, n] contiguous; x: [m, k], rows ldx apart, each contiguous; w_packed from pack_weight,
// float32 (weight_bf16 0) or bfloat16 (1); bias: [n] float32 or NULL. Returns 0, or 1 where this
// build has no AVX2/FMA kernel.
int linear(float *y, const float *x, int64_t ldx, const void *w_packed, int weight_bf16,
           const float *bias, int64_t m, int64_t n, int64_t k, int num_threads) {
#if SUPPORTED
  const int64_t panels = (n + NR - 1) / NR;
  const int unit = unit_panels(panels, gemm_threads(num_threads, panels));
  const int64_t units = (panels + unit - 1) / unit;
  const int64_t block_rows = gemm_block_rows(X_BLOCK_BYTES, k * (int64_t)sizeof(float), TILE_ROWS);
  const int64_t unit_bytes = unit * k * NR * (weight_bf16 ? 2 : 4);
  GEMM_THREAD_LOOP(num_threads, units, unit_bytes, m, block_rows, {
    unit_rows(y, x, ldx, w_packed, weight_bf16, bias, m0, m1, m, n, k, q * unit, panels, unit);
  });
  return 0;
#else
  (void)y, (void)x, (void)ldx, (void)w_packed, (void)weight_bf16, (void)bias, (void)m, (void)n;
  (void)k, (void)num_threads;
  return 1;
#endif
}
