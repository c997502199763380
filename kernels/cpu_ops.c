// The decoder's elementwise steps for float32 and bfloat16 activations on the CPU, each one pass
// over memory where torch runs several ops (and allocates between them):
//
//   rms_norm                    out = x / rms(x) * w
//   fused_add_rms_norm          residual += x; x = residual / rms(residual) * w   (vLLM's)
//   silu_and_mul                out = silu(gate) * up, for rows [gate | up]
//   rotary_embedding_and_cache  neox RoPE on the q and k heads of fused QKV rows (all of each
//                               head or its first rotary_dim features), in place; then each
//                               token's K and V written to its slot of the paged cache
//   argmax                      each row's first index of its largest value, or of its first
//                               NaN (torch.argmax's answer): greedy sampling over the logits
//
// Built like paged_attention_cpu.c (shares torch's OpenMP threads) but with -ffp-contract=off:
// the products and sums round as torch's vectorized ops round them. Only the sums of squares are
// reassociated (vectorized), so a norm may differ from torch's in the last bit.
//
// Cache layout: [num_blocks * block_size slots, num_kv_heads, head_dim]; kv_dtype codes as in
// paged_attention_cpu.c: 0 float32, 1 bfloat16, 2 float16, 3 float8 E4M3, 4 float8 E5M2.

#include <math.h>
#include <stdint.h>
#include "cpu_math.h"
#include "cpu_vec.h"

// Rows split over threads; one row, or fewer elements than this, run on the calling thread alone:
// waking the others costs more (a region of one row would wait for a thread that has nothing).
#define PARALLEL_MIN_ELEMENTS (1 << 15)
#define PARALLEL_ROWS(rows, row_elements) \
  ((rows) > 1 && (rows) * (row_elements) >= PARALLEL_MIN_ELEMENTS)

// Activations come in float32 or bfloat16 (_f32 and _bf16 entry points). bfloat16 rows are
// widened, computed in float32 and rounded to bfloat16 wherever the torch ops they replace round
// a result (RMSNorm: the normed row, then its product with the weight; SiLU·mul: silu, then the
// product; RoPE: once; residual add: the sum), so both give the same values.
static inline float ld_f32(const f32_t *p) { return *p; }
static inline void st_f32(f32_t *p, float v) { *p = v; }
static inline float rnd_f32(float v) { return v; }
static inline float ld_bf16(const bf16_t *p) { return bf16_to_float(*p); }
static inline void st_bf16(bf16_t *p, float v) { *p = float_to_bf16(v); }
static inline float rnd_bf16(float v) { return bf16_to_float(float_to_bf16(v)); }

// The rows' elementwise passes, rounded as above. With AVX512_BF16, bfloat16 rounds by one
// instruction (round to nearest even, as torch; it flushes subnormals, ~1e-38, to zero), 16 at a
// time (widened by cpu_vec.h's load_vf_bf16, whose vectors are 16 wide there); the generic loops
// take the tails, and everything elsewhere.
#if defined(__AVX512BF16__)
#define HAVE_CVTNE 1
static inline __m256i round16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
static inline __m512 rnd16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round16(v)), 16));
}
static inline void store16(bf16_t *p, __m512 v) { _mm256_storeu_si256((__m256i *)p, round16(v)); }
#else
#define HAVE_CVTNE 0
#endif

// dst = a + b
static inline void add_f32(f32_t *dst, const f32_t *a, const f32_t *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}
static inline void add_bf16(bf16_t *dst, const bf16_t *a, const bf16_t *b, int64_t n) {
  int64_t i = 0;
#if HAVE_CVTNE
  for (; i + 16 <= n; i += 16) store16(dst + i, load_vf_bf16(a + i) + load_vf_bf16(b + i));
#endif
  for (; i < n; i++) st_bf16(dst + i, ld_bf16(a + i) + ld_bf16(b + i));
}

// out = (x * s) * w: the normed row, then its product with the weight
static inline void norm_mul_f32(f32_t *out, const f32_t *x, float s, const f32_t *w, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = (x[i] * s) * w[i];
}
static inline void norm_mul_bf16(bf16_t *out, const bf16_t *x, float s, const bf16_t *w,
                                 int64_t n) {
  int64_t i = 0;
#if HAVE_CVTNE
  const __m512 sv = _mm512_set1_ps(s);
  for (; i + 16 <= n; i += 16)
    store16(out + i, rnd16(load_vf_bf16(x + i) * sv) * load_vf_bf16(w + i));
#endif
  for (; i < n; i++) st_bf16(out + i, rnd_bf16(ld_bf16(x + i) * s) * ld_bf16(w + i));
}

#define INV_RMS(T)                                                          \
  static inline float inv_rms_##T(const T##_t *x, int64_t dim, float eps) { \
    float sum = 0.0f;                                                       \
    for (int64_t i = 0; i < dim; i++) sum += ld_##T(x + i) * ld_##T(x + i); \
    return 1.0f / sqrtf(sum / (float)dim + eps);                            \
  }

#define RMS_NORM(T)                                                                            \
  int rms_norm_##T(T##_t *out, const T##_t *x, int64_t x_row_stride, const T##_t *weight,      \
                   int64_t rows, int64_t dim, float eps) {                                     \
    _Pragma("omp parallel for if (PARALLEL_ROWS(rows, dim)) schedule(static)")                 \
    for (int64_t r = 0; r < rows; r++) {                                                       \
      const T##_t *xr = x + r * x_row_stride;                                                  \
      T##_t *o = out + r * dim;                                                                \
      norm_mul_##T(o, xr, inv_rms_##T(xr, dim, eps), weight, dim);                              \
    }                                                                                          \
    return 0;                                                                                  \
  }

#define FUSED_ADD_RMS_NORM(T)                                                                  \
  int fused_add_rms_norm_##T(T##_t *x, T##_t *residual, const T##_t *weight, int64_t rows,     \
                             int64_t dim, float eps) {                                         \
    _Pragma("omp parallel for if (PARALLEL_ROWS(rows, dim)) schedule(static)")                 \
    for (int64_t r = 0; r < rows; r++) {                                                       \
      T##_t *xr = x + r * dim, *res = residual + r * dim;                                      \
      add_##T(res, res, xr, dim);                                                              \
      norm_mul_##T(xr, res, inv_rms_##T(res, dim, eps), weight, dim);                          \
    }                                                                                          \
    return 0;                                                                                  \
  }

// The SiLU loops in 512-bit vectors where the target has them (GCC otherwise keeps to 256 bits
// on Intel): elementwise, so the same bits, 1.4x faster (64 x 1,536, 2 threads, Xeon AMX).
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=512")

// silu(g) = g / (1 + exp(-g)), evaluated with exp of -|g| only, so nothing overflows and no
// subnormal appears (torch's gives -3.7e-42 at g = -100, a subnormal that slows every later op).
static inline float silu(float g) {
  const float e = exp_nonpositive(g < 0.0f ? g : -g);
  const float numerator = g < 0.0f ? g * e : g;  // one division, not one a branch
  return numerator / (1.0f + e);
}

// out = silu(gate) * up: silu rounded, then the product
static inline void silu_mul_f32(f32_t *out, const f32_t *gate, const f32_t *up, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = silu(gate[i]) * up[i];
}
#define SILU_CHUNK 256
static inline void silu_mul_bf16(bf16_t *out, const bf16_t *gate, const bf16_t *up, int64_t n) {
  int64_t i = 0;
#if HAVE_CVTNE
  for (; i + SILU_CHUNK <= n; i += SILU_CHUNK) {  // silu vectorized by the compiler, then rounded
    float s[SILU_CHUNK];
    for (int j = 0; j < SILU_CHUNK; j++) s[j] = silu(ld_bf16(gate + i + j));
    for (int j = 0; j < SILU_CHUNK; j += 16)
      store16(out + i + j, rnd16(_mm512_loadu_ps(s + j)) * load_vf_bf16(up + i + j));
  }
#endif
  for (; i < n; i++) st_bf16(out + i, rnd_bf16(silu(ld_bf16(gate + i))) * ld_bf16(up + i));
}
#pragma GCC pop_options

#define SILU_AND_MUL(T)                                                                        \
  int silu_and_mul_##T(T##_t *out, const T##_t *gate_up, int64_t rows, int64_t d) {            \
    _Pragma("omp parallel for if (PARALLEL_ROWS(rows, d)) schedule(static)")                   \
    for (int64_t r = 0; r < rows; r++) {                                                       \
      const T##_t *gate = gate_up + r * 2 * d;                                                 \
      silu_mul_##T(out + r * d, gate, gate + d, d);                                            \
    }                                                                                          \
    return 0;                                                                                  \
  }

#define ROTATE(T)                                                                              \
  static inline void rotate_##T(T##_t *x, const float *cos, const float *sin, int half) {     \
    for (int i = 0; i < half; i++) {                                                           \
      const float x1 = ld_##T(x + i), x2 = ld_##T(x + i + half);                              \
      st_##T(x + i, x1 * cos[i] - x2 * sin[i]);                                                \
      st_##T(x + i + half, x2 * cos[i] + x1 * sin[i]);                                         \
    }                                                                                          \
  }

// A row of n activations into the cache at offset, rounded to the cache dtype.
#ifdef __FLT16_MAX__
#define STORE_F16(cache, i, v) ((_Float16 *)(cache))[i] = (_Float16)(v)
#else
#define STORE_F16(cache, i, v) (void)(cache)  // never reached: the entry point refuses float16
#endif
#define STORE_ROW(T)                                                                           \
  static inline void store_row_##T(int kv_dtype, void *cache, int64_t offset, const T##_t *src, \
                                   int n) {                                                    \
    if (kv_dtype == 0) {                                                                       \
      float *dst = (float *)cache + offset;                                                    \
      for (int i = 0; i < n; i++) dst[i] = ld_##T(src + i);                                    \
    } else if (kv_dtype == 1) {                                                                \
      bf16_t *dst = (bf16_t *)cache + offset;                                                  \
      for (int i = 0; i < n; i++) st_bf16(dst + i, ld_##T(src + i));                          \
    } else if (kv_dtype == 2) {                                                                \
      for (int i = 0; i < n; i++) STORE_F16(cache, offset + i, ld_##T(src + i));             \
    } else {                                                                                   \
      uint8_t *dst = (uint8_t *)cache + offset;                                                \
      if (kv_dtype == 3)                                                                       \
        for (int i = 0; i < n; i++) dst[i] = float_to_e4m3(ld_##T(src + i));                  \
      else                                                                                     \
        for (int i = 0; i < n; i++) dst[i] = float_to_e5m2(ld_##T(src + i));                  \
    }                                                                                          \
  }

int rotary_embedding_and_cache_has_float16(void) {
#ifdef __FLT16_MAX__
  return 1;
#else
  return 0;
#endif
}

// qkv: [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], rows qkv_row_stride apart: the q
// heads, then the k heads, then the v heads. The first rotary_dim features of each q and k head
// rotate (partial rotary; 0: none, the cache write alone). cos, sin: [num_tokens, rotary_dim / 2],
// contiguous.
#define ROTARY_EMBEDDING_AND_CACHE(T)                                                            \
  int rotary_embedding_and_cache_##T(int kv_dtype, T##_t *qkv, int64_t qkv_row_stride,          \
                                     const float *cos, const float *sin, int64_t num_tokens,    \
                                     int num_heads, int num_kv_heads, int head_dim,             \
                                     int rotary_dim, void *key_cache, void *value_cache,        \
                                     const int64_t *slot_mapping) {                             \
    if (kv_dtype < 0 || kv_dtype > 4 || rotary_dim % 2 || rotary_dim > head_dim) return 1;      \
    if (kv_dtype == 2 && !rotary_embedding_and_cache_has_float16()) return 2;                   \
    const int half = rotary_dim / 2, kv_width = num_kv_heads * head_dim;                        \
    _Pragma("omp parallel for if (PARALLEL_ROWS(num_tokens, qkv_row_stride)) schedule(static)") \
    for (int64_t t = 0; t < num_tokens; t++) {                                                  \
      T##_t *row = qkv + t * qkv_row_stride;                                                    \
      const float *c = cos + t * half, *s = sin + t * half;                                     \
      for (int h = 0; half && h < num_heads + num_kv_heads; h++)                                \
        rotate_##T(row + h * head_dim, c, s, half);                                             \
      const T##_t *k = row + num_heads * head_dim, *v = k + kv_width;                           \
      const int64_t offset = slot_mapping[t] * kv_width;                                        \
      store_row_##T(kv_dtype, key_cache, offset, k, kv_width);                                  \
      store_row_##T(kv_dtype, value_cache, offset, v, kv_width);                                \
    }                                                                                           \
    return 0;                                                                                   \
  }

// One pass over a row, VW lanes at a time: each lane's largest value and its first index, and
// whether any value is NaN (then a scan for the first NaN). A compiler leaves a scalar argmax
// loop scalar.
#define ARGMAX(T)                                                                              \
  static int64_t argmax_row_##T(const T##_t *x, int64_t n) {                                   \
    vf m = (vf){0} - INFINITY;                                                                 \
    vi32 at = (vi32){0}, nan = (vi32){0}, index;                                               \
    for (int r = 0; r < VW; r++) index[r] = r;                                                 \
    int64_t i = 0;                                                                             \
    for (; i + VW <= n; i += VW, index += VW) {                                                \
      const vf v = load_vf_##T(x + i);                                                         \
      const vi32 greater = v > m;                                                              \
      m = select_vf(greater, v, m);                                                            \
      at = select_vi32(greater, index, at);                                                    \
      nan |= v != v;                                                                           \
    }                                                                                          \
    float max = -INFINITY;                                                                     \
    int64_t best = 0, any_nan = 0;                                                             \
    for (int r = 0; r < VW; r++) { /* the largest; of equals, the first */                     \
      if (m[r] > max || (m[r] == max && at[r] < best)) max = m[r], best = at[r];               \
      any_nan |= nan[r];                                                                       \
    }                                                                                          \
    for (; i < n; i++) {                                                                       \
      const float v = ld_##T(x + i);                                                           \
      if (v > max) max = v, best = i;                                                          \
      any_nan |= v != v;                                                                       \
    }                                                                                          \
    if (any_nan)                                                                               \
      for (i = 0; i < n; i++)                                                                  \
        if (ld_##T(x + i) != ld_##T(x + i)) return i;                                          \
    return best;                                                                               \
  }                                                                                            \
  int argmax_##T(int64_t *out, const T##_t *x, int64_t x_row_stride, int64_t rows, int64_t n) { \
    if (n < 1) return 1;                                                                       \
    _Pragma("omp parallel for if (PARALLEL_ROWS(rows, n)) schedule(static)")                   \
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row_##T(x + r * x_row_stride, n);       \
    return 0;                                                                                  \
  }

#define CPU_OPS(T)                                                                    \
  INV_RMS(T) RMS_NORM(T) FUSED_ADD_RMS_NORM(T) SILU_AND_MUL(T) ROTATE(T) STORE_ROW(T) \
  ROTARY_EMBEDDING_AND_CACHE(T) ARGMAX(T)
CPU_OPS(f32)
CPU_OPS(bf16)
