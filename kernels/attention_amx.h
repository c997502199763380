#pragma once
// What the AMX attention kernels share beyond the tiles (amx_tiles.h): exp2 and tanh on AVX-512
// for the softmax.

#include <immintrin.h>

#include "amx_tiles.h"

// 2^x for x <= 0 (0 below -126, for -inf and NaN too): a degree-4 polynomial on the fraction,
// relative error 3e-6, exact at 0 (so a running max that holds rescales by exactly 1).
static inline __m512 exp2_nonpositive(__m512 x) {
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(0.013426788f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.052240517f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24128287f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69304401f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(in_range, p, n);
}

// tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2 |y|) <= 1.
static inline __m512 tanh_ps(__m512 y) {
  const __m512 magnitude = _mm512_abs_ps(y);
  const __m512 e = exp2_nonpositive(_mm512_mul_ps(magnitude, _mm512_set1_ps(-2.8853900817779268f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32((int)0x80000000u));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
}
