// The decoder's elementwise steps for float32 activations on the CPU, each one pass over memory
// where torch runs several ops (and allocates between them):
//
//   rms_norm                    out = x / rms(x) * w
//   fused_add_rms_norm          residual += x; x = residual / rms(residual) * w   (vLLM's)
//   silu_and_mul                out = silu(gate) * up, for rows [gate | up]
//   rotary_embedding_and_cache  neox RoPE on the q and k heads of fused QKV rows, in place; then
//                               each token's K and V written to its slot of the paged cache
//
// Built like paged_attention_cpu.c (shares torch's OpenMP threads) but with -ffp-contract=off:
// the products and sums round as torch's vectorized ops round them. Only the sums of squares are
// reassociated (vectorized), so a norm may differ from torch's in the last bit.
//
// Cache layout: [num_blocks * block_size slots, num_kv_heads, head_dim]; kv_dtype codes as in
// paged_attention_cpu.c: 0 float32, 1 bfloat16, 2 float16.

#include <math.h>
#include <stdint.h>

#include "cpu_math.h"

#define PARALLEL_MIN_ELEMENTS (1 << 15)  // below, one thread: waking the other costs more

static inline float inv_rms(const float *x, int64_t dim, float eps) {
  float sum = 0.0f;
  for (int64_t i = 0; i < dim; i++) sum += x[i] * x[i];
  return 1.0f / sqrtf(sum / (float)dim + eps);
}

int rms_norm(float *out, const float *x, int64_t x_row_stride, const float *weight, int64_t rows,
             int64_t dim, float eps) {
#pragma omp parallel for if (rows * dim >= PARALLEL_MIN_ELEMENTS) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * x_row_stride;
    float *o = out + r * dim;
    const float s = inv_rms(xr, dim, eps);
    for (int64_t i = 0; i < dim; i++) o[i] = xr[i] * s * weight[i];
  }
  return 0;
}

int fused_add_rms_norm(float *x, float *residual, const float *weight, int64_t rows, int64_t dim,
                       float eps) {
#pragma omp parallel for if (rows * dim >= PARALLEL_MIN_ELEMENTS) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    float *xr = x + r * dim, *res = residual + r * dim;
    for (int64_t i = 0; i < dim; i++) res[i] = res[i] + xr[i];
    const float s = inv_rms(res, dim, eps);
    for (int64_t i = 0; i < dim; i++) xr[i] = res[i] * s * weight[i];
  }
  return 0;
}

// silu(g) = g / (1 + exp(-g)), evaluated with exp of -|g| only, so nothing overflows and no
// subnormal appears (torch's gives -3.7e-42 at g = -100, a subnormal that slows every later op).
static inline float silu(float g) {
  const float e = exp_nonpositive(g < 0.0f ? g : -g);
  return g < 0.0f ? g * e / (1.0f + e) : g / (1.0f + e);
}

int silu_and_mul(float *out, const float *gate_up, int64_t rows, int64_t d) {
#pragma omp parallel for if (rows * d >= PARALLEL_MIN_ELEMENTS) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *gate = gate_up + r * 2 * d, *up = gate + d;
    float *o = out + r * d;
    for (int64_t i = 0; i < d; i++) o[i] = silu(gate[i]) * up[i];
  }
  return 0;
}

static inline void rotate(float *x, const float *cos, const float *sin, int half) {
  for (int i = 0; i < half; i++) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

static inline void store_row(int kv_dtype, void *cache, int64_t offset, const float *src, int n) {
  if (kv_dtype == 0) {
    float *dst = (float *)cache + offset;
    for (int i = 0; i < n; i++) dst[i] = src[i];
  } else if (kv_dtype == 1) {
    uint16_t *dst = (uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
  } else {
#ifdef __FLT16_MAX__
    _Float16 *dst = (_Float16 *)cache + offset;
    for (int i = 0; i < n; i++) dst[i] = (_Float16)src[i];
#endif
  }
}

int rotary_embedding_and_cache_has_float16(void) {
#ifdef __FLT16_MAX__
  return 1;
#else
  return 0;
#endif
}

// qkv: [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], rows qkv_row_stride apart: the q
// heads, then the k heads, then the v heads. cos, sin: [num_tokens, head_dim / 2], contiguous.
int rotary_embedding_and_cache(int kv_dtype, float *qkv, int64_t qkv_row_stride, const float *cos,
                               const float *sin, int64_t num_tokens, int num_heads,
                               int num_kv_heads, int head_dim, void *key_cache, void *value_cache,
                               const int64_t *slot_mapping) {
  if (kv_dtype < 0 || kv_dtype > 2 || head_dim % 2) return 1;
  if (kv_dtype == 2 && !rotary_embedding_and_cache_has_float16()) return 2;
  const int half = head_dim / 2, kv_width = num_kv_heads * head_dim;
#pragma omp parallel for if (num_tokens * qkv_row_stride >= PARALLEL_MIN_ELEMENTS) schedule(static)
  for (int64_t t = 0; t < num_tokens; t++) {
    float *row = qkv + t * qkv_row_stride;
    const float *c = cos + t * half, *s = sin + t * half;
    for (int h = 0; h < num_heads + num_kv_heads; h++) rotate(row + h * head_dim, c, s, half);
    const float *k = row + num_heads * head_dim, *v = k + kv_width;
    const int64_t offset = slot_mapping[t] * kv_width;
    store_row(kv_dtype, key_cache, offset, k, kv_width);
    store_row(kv_dtype, value_cache, offset, v, kv_width);
  }
  return 0;
}
