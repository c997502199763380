#pragma once
// The float vectors of the CPU attention kernel: one vector of the target's native width, loads
// that widen each cache element type to float32 as they load, and the transpose-and-add tree
// that sums VW vectors at once. Included by paged_attention_cpu.c and cpu_ops.c (inlined into
// their source).
#include <stdint.h>
#include <string.h>

#include "cpu_math.h"
#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// Cache element types. kv_dtype codes, as passed by pagedgen.kernels.cpu: 0 f32, 1 bf16, 2 f16,
// 3 e4m3, 4 e5m2 (cpu_math.h's 8-bit floats).
typedef float f32_t;
typedef uint16_t bf16_t;  // the upper half of a float32
typedef uint8_t e4m3_t;
typedef uint8_t e5m2_t;
#ifdef __FLT16_MAX__
#define HAVE_FLOAT16 1
typedef _Float16 f16_t;
#else
typedef uint16_t f16_t;  // never loaded: the entry point refuses float16 without _Float16
#endif

// One vector of the target's native width: 16 floats with AVX-512, 8 with AVX/AVX2, else 4.
// (A vector wider than the target's registers is lowered through the stack: on AVX2, 16-float
// vectors made this kernel ~5x slower.) Every specialised head_dim is a multiple of 16.
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef uint16_t vu16 __attribute__((vector_size(VW * 2)));
typedef uint32_t vu32 __attribute__((vector_size(VW * 4)));
typedef int32_t vi32 __attribute__((vector_size(VW * 4)));  // lane masks of comparisons

static inline vf load_vf_f32(const f32_t *p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}

// Half-precision loads: one widening instruction where the target has it (GCC lowers the generic
// conversions element by element, or in halves), the generic vector code elsewhere.
static inline vf load_vf_bf16(const bf16_t *p) {
#if VW == 16 && defined(__AVX512F__)
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
#elif VW == 8 && defined(__AVX2__)
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return (vf)_mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
#else
  vu16 h;
  memcpy(&h, p, sizeof h);
  const vu32 bits = __builtin_convertvector(h, vu32) << 16;
  vf v;
  memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

#if VW == 16 && defined(__AVX512F__)
static inline vf load_vf_f16(const f16_t *p) {
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
#elif VW == 8 && defined(__F16C__)
static inline vf load_vf_f16(const f16_t *p) {
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#elif VW == 4 && defined(__F16C__)
static inline vf load_vf_f16(const f16_t *p) {
  return (vf)_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));
}
#elif defined(HAVE_FLOAT16)
typedef _Float16 vh __attribute__((vector_size(VW * 2)));
static inline vf load_vf_f16(const f16_t *p) {
  vh h;
  memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vf);
}
#else
static inline vf load_vf_f16(const f16_t *p) { return (vf){0}; }
#endif

#ifdef HAVE_FLOAT16
static inline float load_f1_f16(const f16_t *p) { return (float)*p; }
#else
static inline float load_f1_f16(const f16_t *p) { return 0.0f; }
#endif

static inline float load_f1_f32(const f32_t *p) { return *p; }
static inline float load_f1_bf16(const bf16_t *p) { return bf16_to_float(*p); }
static inline float load_f1_e4m3(const e4m3_t *p) { return e4m3_to_float(*p); }
static inline float load_f1_e5m2(const e5m2_t *p) { return e5m2_to_float(*p); }

// 8-bit float loads through the float16 conversion where the target has one (it takes float16
// subnormals at full speed, where float32 arithmetic on subnormals stalls). An E5M2 byte is the
// upper byte of a float16. An E4M3 byte sign-extended to 16 bits and shifted left by 7 holds its
// exponent and mantissa where a float16's lie (its sign copied into bits 14-15): with bit 14
// cleared it is the float16 of value / 256 (a float16 subnormal for an E4M3 subnormal), exact.
// E4M3's NaN code loads as 480 there: a saturating write never stores it.
#define E4M3_HALF_BITS 0xbfff  // all but bit 14
#if VW == 16 && defined(__AVX512F__)
static inline vf load_vf_e5m2(const e5m2_t *p) {
  const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
  return (vf)_mm512_cvtph_ps(_mm256_slli_epi16(h, 8));
}
static inline vf load_vf_e4m3(const e4m3_t *p) {
  const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(E4M3_HALF_BITS));
  return (vf)_mm512_cvtph_ps(h) * 256.0f;
}
#elif VW == 8 && defined(__AVX2__) && defined(__F16C__)
static inline vf load_vf_e5m2(const e5m2_t *p) {
  const __m128i h = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
  return (vf)_mm256_cvtph_ps(_mm_slli_epi16(h, 8));
}
static inline vf load_vf_e4m3(const e4m3_t *p) {
  const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
  const __m128i h = _mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(E4M3_HALF_BITS));
  return (vf)_mm256_cvtph_ps(h) * 256.0f;
}
#else
static inline vf load_vf_e5m2(const e5m2_t *p) {
  vf v;
  for (int i = 0; i < VW; i++) v[i] = e5m2_to_float(p[i]);
  return v;
}
static inline vf load_vf_e4m3(const e4m3_t *p) {
  vf v;
  for (int i = 0; i < VW; i++) v[i] = e4m3_to_float(p[i]);
  return v;
}
#endif

static inline void store_vf(float *p, vf v) { memcpy(p, &v, sizeof v); }

// 2 VW elements from p as two vectors. bfloat16: the even elements, then the odd ones (two vector
// ops, where widening the halves in order takes four); the other types in order.
#define PAIRED_bf16 1
static inline void load_vf2_bf16(const bf16_t *p, vf *even, vf *odd) {
  vu32 bits;
  memcpy(&bits, p, sizeof bits);
  const vu32 e = bits << 16, o = bits & 0xffff0000u;
  memcpy(even, &e, sizeof e);
  memcpy(odd, &o, sizeof o);
}
#define LOAD_VF2_IN_ORDER(KV)                                                  \
  static inline void load_vf2_##KV(const KV##_t *p, vf *first, vf *second) { \
    *first = load_vf_##KV(p);                                                  \
    *second = load_vf_##KV(p + VW);                                            \
  }
#define PAIRED_f32 0
#define PAIRED_f16 0
#define PAIRED_e4m3 0
#define PAIRED_e5m2 0
LOAD_VF2_IN_ORDER(f32)
LOAD_VF2_IN_ORDER(f16)
LOAD_VF2_IN_ORDER(e4m3)
LOAD_VF2_IN_ORDER(e5m2)

// The 2 VW elements whose even ones are e and odd ones o, in order.
static inline void interleave_vf(vf e, vf o, vf *lo, vf *hi) {
  vi32 lo_lanes, hi_lanes;
  for (int i = 0; i < VW / 2; i++) {
    lo_lanes[2 * i] = i, lo_lanes[2 * i + 1] = VW + i;
    hi_lanes[2 * i] = VW / 2 + i, hi_lanes[2 * i + 1] = VW + VW / 2 + i;
  }
  *lo = __builtin_shuffle(e, o, lo_lanes);
  *hi = __builtin_shuffle(e, o, hi_lanes);
}

// Lane by lane, mask ? a : b, for a mask from a vector comparison (each lane all ones or zeros).
static inline vi32 select_vi32(vi32 mask, vi32 a, vi32 b) { return (mask & a) | (~mask & b); }
static inline vf select_vf(vi32 mask, vf a, vf b) {
  return (vf)select_vi32(mask, (vi32)a, (vi32)b);
}

// float_to_bf16 (cpu_math.h) lane by lane: round to nearest even, NaN stays NaN.
static inline vu16 vf_to_bf16(vf v) {
  vu32 bits;
  memcpy(&bits, &v, sizeof bits);
  const vi32 nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const vu32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const vu32 quiet = (bits >> 16) | 0x40u;
  return __builtin_convertvector((vu32)select_vi32(nan, (vi32)quiet, (vi32)rounded), vu16);
}

// VW vectors -> one vector whose lane r holds the sum of a[r]'s lanes: a transpose-and-add tree,
// about 3 instructions a key where a horizontal sum per key takes 6 to 10.
static inline vf reduce_vw(const vf *a) {
#if VW == 16 && defined(__AVX512F__)
  __m512 b[8], c[4], d[2];
  for (int p = 0; p < 8; p++) {  // quads 0-1: key 2p, quads 2-3: key 2p + 1
    const __m512 x = (__m512)a[2 * p], y = (__m512)a[2 * p + 1];
    b[p] = _mm512_shuffle_f32x4(x, y, 0x44) + _mm512_shuffle_f32x4(x, y, 0xEE);
  }
  for (int p = 0; p < 4; p++)  // quad q: key 4p + q
    c[p] = _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0x88) +
           _mm512_shuffle_f32x4(b[2 * p], b[2 * p + 1], 0xDD);
  for (int p = 0; p < 2; p++)  // quad q: keys 8p + q, 8p + q + 4, each in two halves
    d[p] = _mm512_unpacklo_ps(c[2 * p], c[2 * p + 1]) + _mm512_unpackhi_ps(c[2 * p], c[2 * p + 1]);
  const __m512 e = (__m512)_mm512_unpacklo_pd((__m512d)d[0], (__m512d)d[1]) +
                   (__m512)_mm512_unpackhi_pd((__m512d)d[0], (__m512d)d[1]);
  // lane 4q + m holds key q + 4m
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return (vf)_mm512_permutexvar_ps(order, e);
#elif VW == 8 && defined(__AVX__)
  __m256 b[4], c[2];
  for (int p = 0; p < 4; p++) {  // half 0: key 2p, half 1: key 2p + 1
    const __m256 x = (__m256)a[2 * p], y = (__m256)a[2 * p + 1];
    b[p] = _mm256_permute2f128_ps(x, y, 0x20) + _mm256_permute2f128_ps(x, y, 0x31);
  }
  for (int p = 0; p < 2; p++) c[p] = _mm256_hadd_ps(b[2 * p], b[2 * p + 1]);
  const __m256 e = _mm256_hadd_ps(c[0], c[1]);  // lane 4h + i holds key 2i + h
  return (vf)_mm256_permutevar8x32_ps(e, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
#else
  vf s;
  for (int r = 0; r < VW; r++) {
    float t = 0.0f;
    for (int i = 0; i < VW; i++) t += a[r][i];
    s[r] = t;
  }
  return s;
#endif
}
