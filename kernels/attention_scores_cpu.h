#pragma once
// The scores of the CPU attention kernel (paged_attention_cpu.c, which inlines this file): q . k
// for VW keys at a time, their VW partial-sum vectors summed by one transpose-and-add tree
// (AVX512_BF16 dot products for bfloat16 keys), and the softmax over a head's scores.
#include <math.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_vec.h"

// s[r] = scale * acc[r]'s sum for the count <= VW keys scored.
static inline void store_scores(const vf *acc, int count, float scale, float *s) {
  const vf sum = reduce_vw(acc) * scale;
  if (count == VW) store_vf(s, sum);
  else memcpy(s, &sum, sizeof(float) * (size_t)count);
}

// s[r] = scale * (q . k_r) for the count <= VW keys k_r = k + r * row_stride of one kv head;
// q is HD / VW vectors. Rows past count are not read (they may lie past the block).
#define QK_KEYS(KV, HD)                                                                       \
  static inline __attribute__((always_inline)) void qk_keys_##KV##_##HD(                     \
      const vf *q, const KV##_t *k, int64_t row_stride, int count, float scale, float *s) {  \
    vf acc[VW];                                                                               \
    _Pragma("GCC unroll 16") for (int r = 0; r < VW; r++) {                                   \
      if (r < count) {                                                                        \
        const KV##_t *kr = k + r * row_stride;                                                \
        vf a = q[0] * load_vf_##KV(kr);                                                       \
        for (int j = 1; j < (HD) / VW; j++) a += q[j] * load_vf_##KV(kr + j * VW);            \
        acc[r] = a;                                                                           \
      } else {                                                                                \
        acc[r] = (vf){0};                                                                     \
      }                                                                                       \
    }                                                                                         \
    store_scores(acc, count, scale, s);                                                       \
  }

// bfloat16 keys with AVX512_BF16: q rounded to bfloat16 (a bfloat16 model's query already is),
// then one dot-product instruction per 32 elements, products exact and summed in float32.
#if VW == 16 && defined(__AVX512BF16__)
#define HAVE_DPBF16 1
#define QK_KEYS_DPBF16(HD)                                                                    \
  static inline __attribute__((always_inline)) vf dot_dpbf16_##HD(const __m512bh *q,         \
                                                                  const bf16_t *kr) {         \
    __m512 a = _mm512_setzero_ps();                                                           \
    for (int j = 0; j < (HD) / 32; j++) {                                                     \
      __m512bh k; /* memcpy: GCC 12 took a cast of _mm512_loadu_si512 through the stack */   \
      memcpy(&k, kr + 32 * j, sizeof k);                                                      \
      a = _mm512_dpbf16_ps(a, q[j], k);                                                       \
    }                                                                                         \
    return (vf)a;                                                                             \
  }                                                                                           \
  static inline __attribute__((always_inline)) void qk_keys_dpbf16_##HD(                     \
      const __m512bh *q, const bf16_t *k, int64_t row_stride, int count, float scale,        \
      float *s) {                                                                             \
    vf acc[VW];                                                                               \
    if (count == VW) { /* no test per key where all are there */                          \
      _Pragma("GCC unroll 16") for (int r = 0; r < VW; r++)                                   \
        acc[r] = dot_dpbf16_##HD(q, k + r * row_stride);                                      \
    } else {                                                                                  \
      _Pragma("GCC unroll 16") for (int r = 0; r < VW; r++)                                   \
        acc[r] = r < count ? dot_dpbf16_##HD(q, k + r * row_stride) : (vf){0};                \
    }                                                                                         \
    store_scores(acc, count, scale, s);                                                       \
  }
#else
#define HAVE_DPBF16 0
#endif

// The largest of s[0 .. n), VW lanes at a time (GCC leaves a scalar max loop scalar: one chain
// of dependent compares).
static inline float max_of(const float *s, int n) {
  vf m = (vf){0} - INFINITY;
  int t = 0;
  for (; t + VW <= n; t += VW) {
    const vf x = load_vf_f32(s + t);
    m = select_vf(x > m, x, m);
  }
  float max = -INFINITY;
  for (int r = 0; r < VW; r++) max = m[r] > max ? m[r] : max;
  for (; t < n; t++) max = s[t] > max ? s[t] : max;
  return max;
}

// Softmax of each query head's scores in place, a row's last score being the query's own
// position (after the soft cap, if any, then ALiBi's slope * (key position - query position) where
// alibi is not NULL); inv_sum[g] is 1 / the sum of row g's exponentials, applied to the output
// instead of to every probability. A sink (sinks not NULL) adds exp(sinks[g]) to row g's sum and
// takes no output.
static void softmax_rows(float softcap, const float *sinks, const float *alibi, float *scores,
                         int group, int span, float *inv_sum) {
  for (int g = 0; g < group; g++) {
    float *s = scores + g * span;
    if (softcap > 0.0f) {
      const float cap = softcap, inv_cap = 1.0f / softcap;
      for (int t = 0; t < span; t++) s[t] = cap * tanhf(s[t] * inv_cap);
    }
    if (alibi != NULL)
      for (int t = 0; t < span; t++) s[t] += alibi[g] * (float)(t - (span - 1));
    float max = max_of(s, span);
    if (sinks != NULL && sinks[g] > max) max = sinks[g];
    float sum = sinks != NULL ? exp_nonpositive(sinks[g] - max) : 0.0f;
    for (int t = 0; t < span; t++) {
      s[t] = exp_nonpositive(s[t] - max);
      sum += s[t];
    }
    inv_sum[g] = 1.0f / sum;
  }
}
