// Matmul over quantized weights kept at their stored size: y[M, N] = x[M, K] @ W[N, K]^T (+ bias),
// x and y float32 or bfloat16, W as pagedgen.layers.quantized_weight.QuantizedWeight holds it:
// 4- or 8-bit integers q in groups along k with a float scale (and optionally a minimum) each,
// W[n, k] = q[n, k] * scale[n, g] + min[n, g], g = k / group.
//
// The scheme is llama.cpp's with x kept to about 15 bits, not 8: each row of x is quantized in
// blocks along k to integers v = round-to-nearest-even(x / e), e = max|x| / 32512, held as two
// int8 digits v = 255 * hi + lo (|hi|, |lo| <= 127). Integer dot products of both digits run per
// block against the same weight vectors, exact in int32, isum = 255 * isum_hi + isum_lo (below
// 128 * 128 * 32512 < 2^29), then a float epilogue in a fixed order per (m, n):
//
//     for each group g, for each block i of g:     acc += (float)isum_i * (e[m, i] * scale[n, g])
//     then, with mins:                             acc += min[n, g] * xsum[m, g]
//     finally                                      y = acc (+ bias[n]), rounded once to y's dtype
//
// A block (a "granule") is 128, 64, 32 or 16 k: the largest that divides the weight's group (32 for
// GGUF's Q4_0 / Q4_K / Q8_0, 16 for Q6_K, 128 for online int8 and int4), so x is quantized as finely
// as the weight's own scales change, and a large group's epilogue runs once per 128 k, not per 32
// (at 64 rows on AMX, 1.8x faster). With one digit (W8A8: int8 weights made for int8 activations)
// e = max|x| / 127 and v is the digit itself: half the integer dot products, the same epilogue.
// xsum is the sum of the ORIGINAL activations over the group, in double, in k order. Integer sums
// are exact and this file is built without reassociation or FMA contraction, so every path
// (AVX-512 VNNI, AVX2, plain C, and AMX-INT8 below, which takes two digits) gives the same bits,
// and a row's output never depends on the other rows.
//
// W is packed once, at load, into panels of 16 output columns (zero past N), each one stream:
//
//     panel p: ints   [K / 4][16][4] int8 (8 bits: a quad of k per column, one vpdpbusd operand)
//                     [K / 8][16][4] uint8 (4 bits: the low nibbles are k quad 2i, high quad 2i + 1)
//              scales [K / group][16] float32, or float16 where every scale and min is one
//              mins   [K / group][16] the same (only where the weight has mins)
//              (zero up to a multiple of 64 bytes)
//
// float16 parameters (GGUF's own: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 store their scales and mins so)
// are widened exactly, so they give the same bits as float32 ones; at one row a Q4_1 panel is then
// 0.625 bytes a weight, not 0.75.
//
// VNNI: vpdpbusd is unsigned x signed. Weights are the unsigned side, x's digits the signed one:
// 4-bit weights (0..15) as they are, 8-bit ones offset by 128 as they are loaded (^ 0x80), so a
// block's sum over-counts 128 * sum(v), which each row's xoff (computed with its digits) takes
// back. AVX2: maddubs + madd with ones (exact below 2^15: for 8-bit weights |w| (<= 128) is the
// unsigned side and digit * sign(w) (<= 127) the signed one); where the target has AVX-VNNI (AVX2
// cores without AVX-512: Intel's since Alder Lake, Sierra Forest Xeons), one 256-bit vpdpbusd on
// the same operands.
//
// Threads split the panels; each panel is read from memory once for all rows of x (in blocks of
// X_BLOCK_BYTES of x's digits) while the first row tile prefetches the next panel (but for W8A8
// at one or two rows: see linear_quant).

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm_loop.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define PATH 2  // AVX-512 VNNI
#define MR 8
#elif defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define PATH 1  // AVX2, with AVX-VNNI's vpdpbusd (256 bits) where the target has it
#define MR 4
#else
#define PATH 0  // plain C
#define MR 4
#endif

#define NR 16                    // output columns per panel
#define X_LEVELS 32512           // |x| / e, x's integer scale (two digits of base 255)
#define X_LEVELS_1 127           // the same with one digit
#define X_BLOCK_BYTES (4 << 20)  // quantized x read per pass over W
#define MR_PAIR 6                // rows of a W8A8 tile of two panels (AVX-512)
#define MR_8_2 6  // rows of an AVX-512 tile of 8-bit weights and two digits (8: 0.8x, registers)
// Rows from which W8A8 takes pairs of panels (at 16-48 rows the two tie on Llama-3-8B's shapes on
// a Zen 4, at 8 single panels' 8-row tiles lead; from 64 rows pairs, 1.03-1.1x).
#define PAIR_MIN_ROWS 48

#if PATH == 2 || (PATH == 1 && defined(__AVXVNNI__))
#define VNNI 1  // vpdpbusd: four u8 x s8 products summed into each int32 lane, exactly
#else
#define VNNI 0
#endif

// 2 AVX-512 VNNI, 1 AVX2, 3 AVX2 with AVX-VNNI, 0 plain C.
int cpu_gemm_quant_path(void) { return PATH == 1 && VNNI ? 3 : PATH; }

typedef struct {
  int64_t n, k, group, granule, groups, kblocks;
  int bits, has_mins, half;  // half: the scales and mins are float16
  int digits;                // x's int8 digits: 2 (about 15 bits) or 1 (8 bits)
  int64_t panel_bytes, int_bytes, mins_offset;  // mins_offset: bytes from a panel's scales
} Shape;

static Shape shape_of(int64_t n, int64_t k, int bits, int64_t group, int has_mins, int half) {
  Shape s;
  s.n = n, s.k = k, s.group = group, s.bits = bits, s.has_mins = has_mins, s.half = half;
  s.digits = 2;
  s.granule = group % 128 == 0 ? 128 : group % 64 == 0 ? 64 : group % 32 == 0 ? 32 : 16;
  s.groups = k / group, s.kblocks = k / s.granule;
  s.int_bytes = k * NR * bits / 8;
  s.mins_offset = s.groups * NR * (half ? 2 : 4);
  s.panel_bytes = (s.int_bytes + s.mins_offset * (1 + has_mins) + 63) / 64 * 64;
  return s;
}

int64_t quant_panel_bytes(int64_t k, int bits, int64_t group, int has_mins, int half) {
  return shape_of(0, k, bits, group, has_mins, half).panel_bytes;
}

// Element i of float16 bits, exactly (no F16C on the plain-C build).
static inline float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (exp == 31 ? 0x7F800000u : (exp + 112) << 23) | man << 13;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// A panel's parameter i (scales, or mins at mins_offset) as float.
static inline float param_at(const Shape *s, const uint8_t *params, int64_t i) {
  if (s->half) {
    uint16_t h;
    memcpy(&h, params + 2 * i, sizeof h);
    return half_to_float(h);
  }
  float f;
  memcpy(&f, params + 4 * i, sizeof f);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Packing: out [ceil(n / 16)][panel_bytes] from q (int8 [n, k], or uint8 [n, k / 2] of nibbles,
// QuantizedWeight's layout), scales and mins [n, k / group], float32 or (half) float16 bits.

// The 4-bit values k = 8i .. 8i + 7 of a row as one panel word: byte b holds k = 8i + b in its low
// nibble, k = 8i + 4 + b in its high one. in: the row's 4 bytes from 8i, two values a byte.
static inline uint32_t oct_word(const uint8_t *in) {
  uint8_t v[8];
  for (int b = 0; b < 4; b++) v[2 * b] = in[b] & 0xF, v[2 * b + 1] = in[b] >> 4;
  uint32_t word = 0;
  for (int b = 0; b < 4; b++) word |= (uint32_t)(v[b] | v[4 + b] << 4) << (8 * b);
  return word;
}

int pack_weight_quant(uint8_t *out, const uint8_t *q, const uint8_t *scales, const uint8_t *mins,
                      int64_t n, int64_t k, int bits, int64_t group, int half) {
  const Shape s = shape_of(n, k, bits, group, mins != NULL, half);
  const int64_t panels = (n + NR - 1) / NR, row_bytes = k * bits / 8, size = half ? 2 : 4;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; p++) {
    uint8_t *ints = out + p * s.panel_bytes;
    uint8_t *sc = ints + s.int_bytes, *mn = sc + s.mins_offset;
    memset(sc, 0, (size_t)(s.panel_bytes - s.int_bytes));
    for (int64_t j = 0; j < NR; j++) {
      const int64_t row = p * NR + j;
      const int live = row < n;
      for (int64_t g = 0; live && g < s.groups; g++) {
        memcpy(sc + (g * NR + j) * size, scales + (row * s.groups + g) * size, (size_t)size);
        if (s.has_mins)
          memcpy(mn + (g * NR + j) * size, mins + (row * s.groups + g) * size, (size_t)size);
      }
      // One word a quad (8 bits) or an oct (4 bits) of k: [k / 4 or k / 8][16][4 bytes].
      for (int64_t i = 0; i < row_bytes / 4; i++) {
        uint32_t word = 0;
        if (live && bits == 8) memcpy(&word, q + row * row_bytes + 4 * i, 4);
        if (live && bits == 4) word = oct_word(q + row * row_bytes + 4 * i);
        memcpy(ints + (i * NR + j) * 4, &word, 4);
      }
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Online quantization of a float weight w [n, k] (float32, or bfloat16 bits with w_bf16), one pass
// a row, into QuantizedWeight's layout. 8 bits (mins NULL): q = round(w / s), s = max|w| / 127 over
// the group. 4 bits: q = round((w - min) / s), s = (max - min) / 15, two values a byte. s and min
// are taken to their nearest float16 values first (s where that is a normal float16, min where it
// is finite), so the panels hold them in half the bytes; q is rounded against them.

// f's nearest float16 value where that is finite and, unless subnormal_ok, zero or normal; else f.
static inline float float16_near(float f, int subnormal_ok) {
#ifdef __FLT16_MAX__
  const float h = (float)(_Float16)f, a = fabsf(h);
  if (a <= 65504.0f && (subnormal_ok || a == 0.0f || a >= 6.103515625e-05f)) return h;
#else
  (void)subnormal_ok;
#endif
  return f;
}

// Element i of float32 data, or of bfloat16 bits with bf16.
static inline float x_at(const void *x, int x_bf16, int64_t i) {
  if (!x_bf16) return ((const float *)x)[i];
  const uint32_t bits = (uint32_t)((const uint16_t *)x)[i] << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

int quantize_weight(uint8_t *q, float *scales, float *mins, const void *w, int w_bf16, int64_t n,
                    int64_t k, int bits, int64_t group) {
  if (!(bits == 4 || bits == 8) || group <= 0 || k % group || (bits == 4) != (mins != NULL))
    return 1;
  const int64_t groups = k / group;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; row++)
    for (int64_t g = 0; g < groups; g++) {
      const int64_t k0 = row * k + g * group;
      float low = x_at(w, w_bf16, k0), high = low, amax = 0.0f;
      for (int64_t i = k0; i < k0 + group; i++) {
        const float v = x_at(w, w_bf16, i);
        low = fminf(low, v), high = fmaxf(high, v), amax = fmaxf(amax, fabsf(v));
      }
      if (bits == 4) low = float16_near(low, 1);
      const float scale = float16_near(bits == 8 ? amax / 127.0f : (high - low) / 15.0f, 0);
      const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      scales[row * groups + g] = scale;
      if (bits == 8) {
        for (int64_t i = k0; i < k0 + group; i++) {
          const float v = nearbyintf(x_at(w, w_bf16, i) * inv);
          q[i] = (uint8_t)(int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
        continue;
      }
      mins[row * groups + g] = low;
      for (int64_t i = k0; i < k0 + group; i += 2) {
        float v0 = nearbyintf((x_at(w, w_bf16, i) - low) * inv);
        float v1 = nearbyintf((x_at(w, w_bf16, i + 1) - low) * inv);
        v0 = v0 > 15.0f ? 15.0f : v0 < 0.0f ? 0.0f : v0;  // (min rounded: either end)
        v1 = v1 > 15.0f ? 15.0f : v1 < 0.0f ? 0.0f : v1;
        q[i / 2] = (uint8_t)((int)v0 | (int)v1 << 4);
      }
    }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Output: rows [r, r + rows) of the tile acc [rows][16] at column col, plus bias, rounded once.

typedef struct {
  void *y;
  int y_bf16;
  int64_t ldy;
  const float *bias;
} Out;

// Round to nearest even; a NaN stays a (quiet) NaN. Branch-free, so the loops below vectorize.
static inline uint16_t bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16, nan = (u >> 16) | 0x40;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static void store_rows(const Out *o, const Shape *s, const float *acc, int64_t r, int rows,
                       int64_t col) {
  const int64_t cols = s->n - col < NR ? s->n - col : NR;
#if PATH == 2  // bf16_round's integer arithmetic, 16 lanes at a time
  const __mmask16 mask = (__mmask16)((1u << cols) - 1);
  const __m512 b = o->bias != NULL ? _mm512_maskz_loadu_ps(mask, o->bias + col) : _mm512_setzero_ps();
  for (int i = 0; i < rows; i++) {
    __m512 v = _mm512_loadu_ps(acc + i * NR);
    if (o->bias != NULL) v = _mm512_add_ps(v, b);
    if (!o->y_bf16) {
      _mm512_mask_storeu_ps((float *)o->y + (r + i) * o->ldy + col, mask, v);
      continue;
    }
    const __m512i u = _mm512_castps_si512(v), high = _mm512_srli_epi32(u, 16);
    const __m512i bias_bit = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i h = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), bias_bit)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    h = _mm512_mask_mov_epi32(h, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    _mm256_mask_storeu_epi16((uint16_t *)o->y + (r + i) * o->ldy + col, mask,
                             _mm512_cvtepi32_epi16(h));
  }
#else
  float zero[NR] = {0};
  const float *bias = o->bias != NULL ? o->bias + col : zero;
  for (int i = 0; i < rows; i++) {
    float v[NR];
    for (int j = 0; j < NR; j++) v[j] = acc[i * NR + j];
    if (o->bias != NULL)  // (never + 0: a -0 sum stays -0, as on every path)
      for (int j = 0; j < NR; j++) v[j] += j < cols ? bias[j] : 0.0f;
    if (o->y_bf16) {
      uint16_t *out = (uint16_t *)o->y + (r + i) * o->ldy + col, h[NR];
      for (int j = 0; j < NR; j++) h[j] = bf16_round(v[j]);
      if (cols == NR)
        memcpy(out, h, sizeof h);  // (a constant size: inlined)
      else
        for (int64_t j = 0; j < cols; j++) out[j] = h[j];
    } else {
      float *out = (float *)o->y + (r + i) * o->ldy + col;
      if (cols == NR)
        memcpy(out, v, sizeof v);
      else
        for (int64_t j = 0; j < cols; j++) out[j] = v[j];
    }
  }
#endif
}

typedef struct {
  const int8_t *xq;
  const float *e, *xsum;
  const int32_t *xoff;  // 128 * sum(v) a block: [m][kblocks], where 8-bit weights are offset
} Activations;

static inline int32_t x_word(const int8_t *xq, int64_t i) {  // x[4i : 4i + 4] as one word
  int32_t w;
  memcpy(&w, xq + 4 * i, sizeof w);
  return w;
}

#if PATH > 0
// ---------------------------------------------------------------------------------------------
// The SIMD paths: VC columns a vector, NV vectors a panel.
#if PATH == 2
#define VC 16
typedef __m512i VI;
typedef __m512 VF;
#define LOADI(p) _mm512_loadu_si512((const void *)(p))
#define STOREI(p, v) _mm512_storeu_si512((void *)(p), v)
#define SET1I _mm512_set1_epi32
#define ZEROI _mm512_setzero_si512
#define SUBI _mm512_sub_epi32
#define ADDI _mm512_add_epi32
#define SLLI32 _mm512_slli_epi32
#define ANDI _mm512_and_si512
#define XORI _mm512_xor_si512
#define SRLI16 _mm512_srli_epi16
#define ZEROF _mm512_setzero_ps
#define LOADF _mm512_loadu_ps
#define STOREF _mm512_storeu_ps
#define SET1F _mm512_set1_ps
#define ADDF _mm512_add_ps
#define MULF _mm512_mul_ps
#define CVTF _mm512_cvtepi32_ps
#define CVTTI _mm512_cvttps_epi32
#define MAXF _mm512_max_ps
#define ABSF _mm512_abs_ps
#define SRAI32 _mm512_srai_epi32
#define MULLOI _mm512_mullo_epi32
static inline float max_lanes(VF v) { return _mm512_reduce_max_ps(v); }
static inline int32_t sum_lanes(VI v) { return _mm512_reduce_add_epi32(v); }
static inline VF round_even(VF v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// v clamped to [-levels, levels] as the scalar loop clamps (a NaN lane compares false), then a
// NaN lane 0.
static inline VF clamp_levels(VF v, VF levels) {
  v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, levels, _CMP_GT_OQ), levels);
  v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, -levels, _CMP_LT_OQ), -levels);
  return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), ZEROF());
}
// The low bytes of v's lanes, in order, at out.
static inline void store_low_bytes(int8_t *out, VI v) {
  _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(v));
}
// VC elements of x (float32, or bfloat16 bits with x_bf16) from i, as float.
static inline VF load_x(const void *x, int x_bf16, int64_t i) {
  if (!x_bf16) return _mm512_loadu_ps((const float *)x + i);
  const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline VI dot_u8s8(VI acc, VI u, VI s) { return _mm512_dpbusd_epi32(acc, u, s); }
// acc + u . (x's word at p, in every lane), the broadcast folded into the instruction: in asm,
// as GCC 12 broadcasts apart and moves the accumulator through a spare register (19 instructions
// a 64-byte step of 4-bit weights at one row, against 12; 10-25 % faster at one row).
static inline VI dot_u8_word(VI acc, VI u, const int8_t *p) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
  return acc;
}
#else
#define VC 8
typedef __m256i VI;
typedef __m256 VF;
#define LOADI(p) _mm256_loadu_si256((const __m256i *)(p))
#define STOREI(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define SET1I _mm256_set1_epi32
#define ZEROI _mm256_setzero_si256
#define SUBI _mm256_sub_epi32
#define ADDI _mm256_add_epi32
#define SLLI32 _mm256_slli_epi32
#define ANDI _mm256_and_si256
#define XORI _mm256_xor_si256
#define SRLI16 _mm256_srli_epi16
#define ZEROF _mm256_setzero_ps
#define LOADF _mm256_loadu_ps
#define STOREF _mm256_storeu_ps
#define SET1F _mm256_set1_ps
#define ADDF _mm256_add_ps
#define MULF _mm256_mul_ps
#define CVTF _mm256_cvtepi32_ps
#define CVTTI _mm256_cvttps_epi32
#define MAXF _mm256_max_ps
#define SRAI32 _mm256_srai_epi32
#define MULLOI _mm256_mullo_epi32
static inline VF ABSF(VF v) { return _mm256_and_ps(v, _mm256_castsi256_ps(SET1I(0x7fffffff))); }
static inline float max_lanes(VF v) {
  float lanes[VC], m = 0.0f;
  _mm256_storeu_ps(lanes, v);
  for (int j = 0; j < VC; j++) m = fmaxf(m, lanes[j]);
  return m;
}
static inline int32_t sum_lanes(VI v) {
  int32_t lanes[VC], sum = 0;
  _mm256_storeu_si256((__m256i *)lanes, v);
  for (int j = 0; j < VC; j++) sum += lanes[j];
  return sum;
}
static inline VF round_even(VF v) {
  return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline VF clamp_levels(VF v, VF levels) {  // as the AVX-512 one
  const VF low = _mm256_sub_ps(ZEROF(), levels);
  v = _mm256_blendv_ps(v, levels, _mm256_cmp_ps(v, levels, _CMP_GT_OQ));
  v = _mm256_blendv_ps(v, low, _mm256_cmp_ps(v, low, _CMP_LT_OQ));
  return _mm256_blendv_ps(v, ZEROF(), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
static inline void store_low_bytes(int8_t *out, VI v) {
  const VI pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                   0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const VI b = _mm256_shuffle_epi8(v, pick);
  const int32_t words[2] = {_mm256_extract_epi32(b, 0), _mm256_extract_epi32(b, 4)};
  memcpy(out, words, sizeof words);
}
static inline VF load_x(const void *x, int x_bf16, int64_t i) {
  if (!x_bf16) return _mm256_loadu_ps((const float *)x + i);
  const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if VNNI
static inline VI dot_u8s8(VI acc, VI u, VI s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
// acc + u . (x's word at p, in every lane).
static inline VI dot_u8_word(VI acc, VI u, const int8_t *p) {
  return _mm256_dpbusd_avx_epi32(acc, u, SET1I(x_word(p, 0)));
}
#else
static inline VI dot_u8s8(VI acc, VI u, VI s) {
  const VI pairs = _mm256_maddubs_epi16(u, s);  // exact: every pair sum is below 2^15 here
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
// acc + even . (x's word at p) + odd . (the next word), 4-bit u: the two maddubs summed in int16
// (at most 2 * 2 * 15 * 127 < 2^15) before one madd.
static inline VI dot2_u4s8(VI acc, VI even, VI odd, const int8_t *p) {
  int32_t w[2];
  memcpy(w, p, sizeof w);
  const VI pairs = _mm256_add_epi16(_mm256_maddubs_epi16(even, SET1I(w[0])),
                                    _mm256_maddubs_epi16(odd, SET1I(w[1])));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif
#endif
#define NV (NR / VC)

// VC of a panel's parameters from i on (scales, or mins at mins_offset), widened where float16.
static inline VF load_params(const Shape *s, const uint8_t *params, int64_t i) {
#if PATH == 2
  if (s->half) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(params + 2 * i)));
#else
  if (s->half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(params + 2 * i)));
#endif
  return LOADF((const float *)params + i);
}

// The granule's int32 sum of w * v from the sums of its digits: 255 * hi + lo. Exact: |v| <= 32512,
// 0 <= w + 128 <= 255 (VNNI's 8-bit weights, before xoff) and a granule of at most 128 k keep
// every step below 2^31.
static inline VI combine(VI hi, VI lo) { return ADDI(SUBI(SLLI32(hi, 8), hi), lo); }

// The line at offset in the panel read next (prefetch; NULL: none), asked for into L2 a line of
// this panel at a time: a burst of a block's lines at its start ran W8A8 at 16-64 rows 0.9x as
// fast (Zen 4).
static inline __attribute__((always_inline)) void prefetch_line(const uint8_t *prefetch,
                                                                int64_t offset) {
  if (prefetch != NULL) _mm_prefetch((const char *)(prefetch + offset), _MM_HINT_T1);
}

// acc[r] (float [R][16]) over all of K for rows [r0, r0 + R) of x against one panel, VC columns
// at a time: a row's sums of both digits live across a granule's quads; prefetch: the panel read
// next, or NULL.
static inline __attribute__((always_inline)) void tile(const Shape *s, const Activations *a,
                                                       int64_t r0, const uint8_t *panel,
                                                       const uint8_t *prefetch, float *out,
                                                       const int R, const int D, const int B) {
  VF acc[MR][NV];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = ZEROF();
  const uint8_t *scales = panel + s->int_bytes, *mins = scales + s->mins_offset;
  const int64_t granules = s->group / s->granule, quads = s->granule / 4, k = s->k;
  const int64_t granule_bytes = s->granule * NR * B / 8;
  const uint8_t *w = panel;
  for (int64_t g = 0; g < s->groups; g++) {
    VF ws[NV];
    for (int v = 0; v < NV; v++) ws[v] = load_params(s, scales, g * NR + v * VC);
    for (int64_t gi = 0; gi < granules; gi++, w += granule_bytes) {
      const int64_t block = g * granules + gi, kq = block * quads;  // its first quad of k
      for (int v = 0; v < NV; v++) {
        // Each digit's sums on chain 0, and on VNNI at 1 or 2 rows, where few chains would leave
        // vpdpbusd waiting on its own latency, odd quads (pairs of quads) on chain 1: exact, so
        // added in any order.
        const int c1 = VNNI && R <= 2;
        VI hi[2][MR], lo[2][MR];
        for (int c = 0; c <= c1; c++)
          for (int r = 0; r < R; r++) hi[c][r] = ZEROI(), lo[c][r] = ZEROI();
        if (B == 8) {
#if VNNI
          const VI flip = SET1I((int32_t)0x80808080u);
          for (int64_t i = 0; i < quads; i += 2)
#pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
              if (v == 0) prefetch_line(prefetch, (w - panel) + (i + u) * 64);
              const VI wv = XORI(LOADI(w + (i + u) * 64 + v * VC * 4), flip);  // w + 128
              const int c = c1 ? u : 0;
              for (int r = 0; r < R; r++) {
                const int8_t *xr = a->xq + (r0 + r) * D * k + 4 * (kq + i + u);
                hi[c][r] = dot_u8_word(hi[c][r], wv, xr);
                if (D == 2) lo[c][r] = dot_u8_word(lo[c][r], wv, xr + k);
              }
            }
#else
          for (int64_t i = 0; i < quads; i += 2)
#pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
              if (v == 0) prefetch_line(prefetch, (w - panel) + (i + u) * 64);
              const VI wv = LOADI(w + (i + u) * 64 + v * 32), mag = _mm256_abs_epi8(wv);
              const int c = c1 ? u : 0;
              for (int r = 0; r < R; r++) {
                const int8_t *xr = a->xq + (r0 + r) * D * k;
                const VI xh = SET1I(x_word(xr, kq + i + u));
                hi[c][r] = dot_u8s8(hi[c][r], mag, _mm256_sign_epi8(xh, wv));
                if (D == 2) {
                  const VI xl = SET1I(x_word(xr + k, kq + i + u));
                  lo[c][r] = dot_u8s8(lo[c][r], mag, _mm256_sign_epi8(xl, wv));
                }
              }
            }
#endif
        } else {
          const VI low = SET1I(0x0F0F0F0F);
          for (int64_t i = 0; i < quads / 2; i++) {
            if (v == 0) prefetch_line(prefetch, (w - panel) + i * 64);
            const VI wv = LOADI(w + i * 64 + v * VC * 4);
            const VI even = ANDI(wv, low), odd = ANDI(SRLI16(wv, 4), low);  // quads 2i, 2i + 1
            for (int r = 0; r < R; r++) {
              const int8_t *xr = a->xq + (r0 + r) * D * k;
              const int64_t q = kq + 2 * i;
#if VNNI
              hi[0][r] = dot_u8_word(hi[0][r], even, xr + 4 * q);
              hi[c1][r] = dot_u8_word(hi[c1][r], odd, xr + 4 * q + 4);
              if (D == 2) {
                lo[0][r] = dot_u8_word(lo[0][r], even, xr + k + 4 * q);
                lo[c1][r] = dot_u8_word(lo[c1][r], odd, xr + k + 4 * q + 4);
              }
#else
              hi[0][r] = dot2_u4s8(hi[0][r], even, odd, xr + 4 * q);
              if (D == 2) lo[0][r] = dot2_u4s8(lo[0][r], even, odd, xr + k + 4 * q);
#endif
            }
          }
        }
        if (c1)
          for (int r = 0; r < R; r++)
            hi[0][r] = ADDI(hi[0][r], hi[1][r]), lo[0][r] = ADDI(lo[0][r], lo[1][r]);
        for (int r = 0; r < R; r++) {
          const VF xe = SET1F(a->e[(r0 + r) * s->kblocks + block]);
          VI isum = D == 2 ? combine(hi[0][r], lo[0][r]) : hi[0][r];
          if (VNNI && B == 8) isum = SUBI(isum, SET1I(a->xoff[(r0 + r) * s->kblocks + block]));
          acc[r][v] = ADDF(acc[r][v], MULF(CVTF(isum), MULF(xe, ws[v])));
        }
      }
    }
    if (s->has_mins)
      for (int v = 0; v < NV; v++) {
        const VF wm = load_params(s, mins, g * NR + v * VC);
        for (int r = 0; r < R; r++)
          acc[r][v] = ADDF(acc[r][v], MULF(wm, SET1F(a->xsum[(r0 + r) * s->groups + g])));
      }
  }
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) STOREF(out + r * NR + v * VC, acc[r][v]);
}

#if PATH == 2
// W8A8 (8 bits, one digit) on AVX-512 VNNI: acc (float [2][R][16]) for rows [r0, r0 + R) against
// two panels, each broadcast of x feeding both panels' vpdpbusd. The same sums, in the same order,
// as tile's.
static inline __attribute__((always_inline)) void tile_pair(const Shape *s, const Activations *a,
                                                            int64_t r0, const uint8_t *panel,
                                                            const uint8_t *prefetch, float *out,
                                                            const int R) {
  __m512 acc[2][MR_PAIR];
  for (int r = 0; r < R; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
  const uint8_t *panels[2] = {panel, panel + s->panel_bytes};
  const int64_t granules = s->group / s->granule, quads = s->granule / 4, k = s->k;
  const __m512i flip = SET1I((int32_t)0x80808080u);
  for (int64_t g = 0; g < s->groups; g++) {
    __m512 ws[2];
    for (int p = 0; p < 2; p++) ws[p] = load_params(s, panels[p] + s->int_bytes, g * NR);
    for (int64_t gi = 0; gi < granules; gi++) {
      const int64_t block = g * granules + gi, kq = block * quads;
      __m512i sum[2][MR_PAIR];
      for (int r = 0; r < R; r++) sum[0][r] = sum[1][r] = _mm512_setzero_si512();
      for (int64_t i = 0; i < quads; i++) {
        for (int p = 0; p < 2; p++) prefetch_line(prefetch, p * s->panel_bytes + (kq + i) * 64);
        const __m512i w0 = XORI(LOADI(panels[0] + (kq + i) * 64), flip);  // w + 128
        const __m512i w1 = XORI(LOADI(panels[1] + (kq + i) * 64), flip);
        for (int r = 0; r < R; r++) {
          const __m512i xb = SET1I(x_word(a->xq + (r0 + r) * k, kq + i));
          sum[0][r] = dot_u8s8(sum[0][r], w0, xb);
          sum[1][r] = dot_u8s8(sum[1][r], w1, xb);
        }
      }
      for (int r = 0; r < R; r++) {
        const __m512 xe = SET1F(a->e[(r0 + r) * s->kblocks + block]);
        const __m512i xoff = SET1I(a->xoff[(r0 + r) * s->kblocks + block]);
        for (int p = 0; p < 2; p++) {
          const __m512 isum = CVTF(SUBI(sum[p][r], xoff));
          acc[p][r] = ADDF(acc[p][r], MULF(isum, MULF(xe, ws[p])));
        }
      }
    }
    if (s->has_mins)
      for (int p = 0; p < 2; p++) {
        const __m512 wm = load_params(s, panels[p] + s->int_bytes + s->mins_offset, g * NR);
        for (int r = 0; r < R; r++)
          acc[p][r] = ADDF(acc[p][r], MULF(wm, SET1F(a->xsum[(r0 + r) * s->groups + g])));
      }
  }
  for (int p = 0; p < 2; p++)
    for (int r = 0; r < R; r++) STOREF(out + (p * MR_PAIR + r) * NR, acc[p][r]);
}

#define PAIR_FN(R)                                                                          \
  static void tile_pair_##R(const Shape *s, const Activations *a, int64_t r0,               \
                            const uint8_t *panel, const uint8_t *prefetch, float *out) {    \
    tile_pair(s, a, r0, panel, prefetch, out, R);                                           \
  }
PAIR_FN(1) PAIR_FN(2) PAIR_FN(3) PAIR_FN(4) PAIR_FN(5) PAIR_FN(6)
typedef void (*PairTile)(const Shape *, const Activations *, int64_t, const uint8_t *,
                         const uint8_t *, float *);
static const PairTile PAIR_TILES[MR_PAIR + 1] = {0,           tile_pair_1, tile_pair_2,
                                                 tile_pair_3, tile_pair_4, tile_pair_5,
                                                 tile_pair_6};
#endif

#else
// ---------------------------------------------------------------------------------------------
// Plain C: the same sums in the same order, a column at a time.
static inline void tile(const Shape *s, const Activations *a, int64_t r0, const uint8_t *panel,
                        const uint8_t *prefetch, float *out, const int R, const int D,
                        const int B) {
  (void)prefetch;
  const uint8_t *scales = panel + s->int_bytes, *mins = scales + s->mins_offset;
  const int64_t granules = s->group / s->granule;
  for (int r = 0; r < R; r++) {
    const int8_t *xr = a->xq + (r0 + r) * D * s->k;
    for (int j = 0; j < NR; j++) {
      float acc = 0.0f;
      int64_t kk = 0;
      for (int64_t g = 0; g < s->groups; g++) {
        for (int64_t gi = 0; gi < granules; gi++) {
          const int64_t block = kk / s->granule;
          int32_t hi = 0, lo = 0;
          for (int64_t i = 0; i < s->granule; i++, kk++) {
            int wq;
            if (B == 8) {
              wq = (int8_t)panel[((kk / 4) * NR + j) * 4 + kk % 4];
            } else {
              const uint8_t b = panel[((kk / 8) * NR + j) * 4 + kk % 4];
              wq = (kk / 4) % 2 ? b >> 4 : b & 0xF;
            }
            hi += wq * xr[kk], lo += D == 2 ? wq * xr[s->k + kk] : 0;
          }
          const int32_t isum = D == 2 ? 255 * hi + lo : hi;
          acc = acc + (float)isum * (a->e[(r0 + r) * s->kblocks + block] *
                                     param_at(s, scales, g * NR + j));
        }
        if (s->has_mins)
          acc = acc + param_at(s, mins, g * NR + j) * a->xsum[(r0 + r) * s->groups + g];
      }
      out[r * NR + j] = acc;
    }
  }
}
#endif

// A tile function for each rows R, digits D and bits B (each its own code, registers and loops).
#define TILE_FN(R, D, B)                                                                  \
  static void tile_##R##_##D##_##B(const Shape *s, const Activations *a, int64_t r0,       \
                                   const uint8_t *panel, const uint8_t *prefetch,          \
                                   float *out) {                                           \
    tile(s, a, r0, panel, prefetch, out, R, D, B);                                        \
  }
#define TILE_FNS(R) TILE_FN(R, 1, 4) TILE_FN(R, 1, 8) TILE_FN(R, 2, 4) TILE_FN(R, 2, 8)
TILE_FNS(1) TILE_FNS(2) TILE_FNS(3) TILE_FNS(4)
#if MR == 8
TILE_FNS(5) TILE_FNS(6) TILE_FNS(7) TILE_FNS(8)
#define TILE_ROW(D, B)                                                                    \
  {0,                 tile_1_##D##_##B, tile_2_##D##_##B, tile_3_##D##_##B,             \
   tile_4_##D##_##B, tile_5_##D##_##B, tile_6_##D##_##B, tile_7_##D##_##B,             \
   tile_8_##D##_##B}
#else
#define TILE_ROW(D, B) {0, tile_1_##D##_##B, tile_2_##D##_##B, tile_3_##D##_##B, tile_4_##D##_##B}
#endif
typedef void (*Tile)(const Shape *, const Activations *, int64_t, const uint8_t *,
                     const uint8_t *, float *);
// [digits - 1][bits == 8][rows]
static const Tile TILES[2][2][MR + 1] = {{TILE_ROW(1, 4), TILE_ROW(1, 8)},
                                         {TILE_ROW(2, 4), TILE_ROW(2, 8)}};

// ---------------------------------------------------------------------------------------------
// Activations: xq int8 [m][digits][k] (each row's high digits, then its low ones; with one
// digit, v itself), e float [m][kblocks], xsum float [m][groups] (with mins).

// A block of x as integers v = round(x / e), e = max|x| / 32512, in two base-255 digits:
// v = 255 * hi + lo, hi and lo in -127..127 (32512 = 127 * 256 = 255 * 127 + 127); with one digit,
// e = max|x| / 127 and v is the digit. A NaN (or an infinite x, whose block's e is infinite) gives
// v = 0. Every step is exact or one IEEE rounding of one element, so the vector loops (VC elements
// a step) give the scalar loop's bits.

// |v|'s bound with x held in `digits` int8 digits.
static inline float x_levels(int digits) { return digits == 2 ? X_LEVELS : X_LEVELS_1; }

// v's digits as int32: hi = floor((v + 127) / 255), lo = v - 255 * hi; (n + 1) * 257 >> 16 is
// n / 255 for 0 <= n < 2^16 (n = v + 32767 here).
static inline int32_t high_digit(int32_t v) { return (((v + 32768) * 257) >> 16) - 128; }

// max |x[i]| over [k0, k1) (a NaN is passed over, as fmaxf does).
static float block_amax(const void *x, int x_bf16, int64_t k0, int64_t k1) {
  float amax = 0.0f;
  int64_t i = k0;
#if PATH > 0
  VF m = ZEROF();
  for (; i + VC <= k1; i += VC) m = MAXF(ABSF(load_x(x, x_bf16, i)), m);
  amax = max_lanes(m);
#endif
  for (; i < k1; i++) amax = fmaxf(amax, fabsf(x_at(x, x_bf16, i)));
  return amax;
}

// Digits of x[i] * inv for i in [k0, k1): high ones at hi[i], low ones at lo[i]; with lo NULL
// (one digit, levels X_LEVELS_1), v at hi[i]. Returns sum(v) (exact: |v| <= 32512, k1 - k0 <= 128).
static int32_t block_digits(const void *x, int x_bf16, int64_t k0, int64_t k1, float inv,
                            int8_t *hi, int8_t *lo) {
  const float top = x_levels(lo != NULL ? 2 : 1);
  int64_t i = k0;
  int32_t sum = 0;
#if PATH > 0
  const VF levels = SET1F(top), scale = SET1F(inv);
  VI sums = ZEROI();
  for (; i + VC <= k1; i += VC) {
    const VI v = CVTTI(clamp_levels(round_even(MULF(load_x(x, x_bf16, i), scale)), levels));
    sums = ADDI(sums, v);
    if (lo == NULL) {
      store_low_bytes(hi + i, v);
      continue;
    }
    const VI h = SUBI(SRAI32(MULLOI(ADDI(v, SET1I(32768)), SET1I(257)), 16), SET1I(128));
    store_low_bytes(hi + i, h);
    store_low_bytes(lo + i, SUBI(v, MULLOI(h, SET1I(255))));
  }
  sum = sum_lanes(sums);
#endif
  for (; i < k1; i++) {
    float v = nearbyintf(x_at(x, x_bf16, i) * inv);
    v = v > top ? top : v < -top ? -top : v;
    const int32_t vi = v == v ? (int32_t)v : 0, h = lo != NULL ? high_digit(vi) : 0;
    hi[i] = (int8_t)(lo != NULL ? h : vi);
    if (lo != NULL) lo[i] = (int8_t)(vi - 255 * h);
    sum += vi;
  }
  return sum;
}

static void quantize_row(const void *x, int x_bf16, const Shape *s, int8_t *xq, float *e,
                         float *xsum, int32_t *xoff) {
  const float levels = x_levels(s->digits);
  for (int64_t b = 0; b < s->kblocks; b++) {
    const int64_t k0 = b * s->granule, k1 = k0 + s->granule;
    const float amax = block_amax(x, x_bf16, k0, k1);
    const float step = amax / levels, inv = amax > 0.0f ? 1.0f / step : 0.0f;
    e[b] = step;
    const int32_t sum = block_digits(x, x_bf16, k0, k1, inv, xq, s->digits == 2 ? xq + s->k : NULL);
    if (xoff != NULL) xoff[b] = 128 * sum;
  }
  if (xsum == NULL) return;
  // Each group's sum in k order; 8 groups at a time, whose sums are independent chains.
  for (int64_t g0 = 0; g0 < s->groups; g0 += 8) {
    const int64_t ng = s->groups - g0 < 8 ? s->groups - g0 : 8;
    double sum[8] = {0.0};
    for (int64_t i = 0; i < s->group; i++)
      for (int64_t j = 0; j < ng; j++) sum[j] += x_at(x, x_bf16, (g0 + j) * s->group + i);
    for (int64_t j = 0; j < ng; j++) xsum[g0 + j] = (float)sum[j];
  }
}

// The activations of rows [0, m), with xoff where with_xoff: malloc'd, freed by free_activations.
// 2 where memory runs out.
static int quantize_activations(const void *x, int x_bf16, int64_t ldx, int64_t m, const Shape *s,
                                int with_xoff, int num_threads, Activations *a) {
  int8_t *xq = malloc((size_t)(m * s->digits * s->k));
  float *e = malloc(sizeof(float) * (size_t)(m * s->kblocks));
  float *xsum = s->has_mins ? malloc(sizeof(float) * (size_t)(m * s->groups)) : NULL;
  int32_t *xoff = with_xoff ? malloc(sizeof(int32_t) * (size_t)(m * s->kblocks)) : NULL;
  a->xq = xq, a->e = e, a->xsum = xsum, a->xoff = xoff;
  if (xq == NULL || e == NULL || (s->has_mins && xsum == NULL) || (with_xoff && xoff == NULL))
    return 2;
  const size_t x_elem = x_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(num_threads < 1 ? 1 : num_threads) if (m > 1)
  for (int64_t r = 0; r < m; r++)
    quantize_row((const char *)x + r * ldx * x_elem, x_bf16, s, xq + r * s->digits * s->k,
                 e + r * s->kblocks, s->has_mins ? xsum + r * s->groups : NULL,
                 with_xoff ? xoff + r * s->kblocks : NULL);
  return 0;
}

static void free_activations(Activations *a) {
  free((void *)a->xq), free((void *)a->e), free((void *)a->xsum), free((void *)a->xoff);
}

static int valid(int bits, int64_t group, int64_t k) {
  return (bits == 4 || bits == 8) && group > 0 && group % 16 == 0 && k % group == 0;
}

// y: [m, n] rows ldy apart (float32, or bfloat16 bits with y_bf16); x: [m, k] rows ldx apart,
// float32 or bfloat16 bits; w_packed from pack_weight_quant; bias: float32 [n] or NULL; digits:
// x's int8 digits, 2 or 1. Returns 0, 1 for a shape the packing does not take, 2 where memory
// runs out.
int linear_quant(void *y, int y_bf16, int64_t ldy, const void *x, int x_bf16, int64_t ldx,
                 const uint8_t *w_packed, const float *bias, int64_t m, int64_t n, int64_t k,
                 int bits, int64_t group, int has_mins, int half, int num_threads, int digits) {
  if (!valid(bits, group, k) || (digits != 1 && digits != 2)) return 1;
  Shape s = shape_of(n, k, bits, group, has_mins, half);
  s.digits = digits;
  Activations a;
  if (quantize_activations(x, x_bf16, ldx, m, &s, VNNI && bits == 8, num_threads, &a)) {
    free_activations(&a);
    return 2;
  }
  const Out o = {y, y_bf16, ldy, bias};
  const int64_t panels = (n + NR - 1) / NR;
  // Units of one panel, or for W8A8 prompts on AVX-512 of two (pair tiles; a last one alone).
  const int up = PATH == 2 && bits == 8 && digits == 1 && m >= PAIR_MIN_ROWS ? 2 : 1;
  const int tile_rows = up == 2 ? MR_PAIR : PATH == 2 && bits == 8 && digits == 2 ? MR_8_2 : MR;
  const int64_t units = (panels + up - 1) / up;
  const int64_t block_rows = gemm_block_rows(X_BLOCK_BYTES, digits * k, tile_rows);
  GEMM_THREAD_LOOP(num_threads, units, up * s.panel_bytes, m, block_rows, {
    const uint8_t *panel = w_packed + q * up * s.panel_bytes;
    float out[2 * MR * NR] __attribute__((aligned(64)));
    for (int64_t r = m0; r < m1; r += tile_rows) {
      const int rows = m1 - r < tile_rows ? (int)(m1 - r) : tile_rows;
      // (W8A8 at one or two rows streams W faster on the hardware's prefetcher alone: 1.03-1.3x
      // at one row, Zen 4; two digits and 4 bits there lose 1.4-1.7x without)
      const int ahead = r == m0 && !(digits == 1 && m1 - m0 <= 2) && q_next >= 0 &&
                        (q_next + 1) * up <= panels;
      const uint8_t *next = ahead ? w_packed + q_next * up * s.panel_bytes : NULL;
#if PATH == 2
      if (up == 2 && (q + 1) * 2 <= panels) {
        PAIR_TILES[rows](&s, &a, r, panel, next, out);
        for (int p = 0; p < 2; p++)
          store_rows(&o, &s, out + p * MR_PAIR * NR, r, rows, (q * 2 + p) * NR);
        continue;
      }
#endif
      TILES[digits - 1][bits == 8][rows](&s, &a, r, panel, next, out);
      store_rows(&o, &s, out, r, rows, q * up * NR);
    }
  });
  free_activations(&a);
  return 0;
}

#if defined(__AMX_INT8__) && PATH == 2
// ---------------------------------------------------------------------------------------------
// AMX-INT8 (built apart, with -mamx-int8): tdpbssd sums 16 rows of x against a panel's 16
// columns over one granule at a time, each digit on its tile, in steps of up to 64 k (A: 16 rows
// x 64 bytes of one digit, rows 2k bytes apart in x's [m][2][k]; B: the panel's 16 rows of quads
// there, which is the packed int8 layout as it is; 4-bit panels are widened to it once per
// panel; one B tile load for both digits), then the same epilogue as above on the stored int32
// tiles (255 * hi + lo): the same bits.
#include "amx_tiles.h"

#define TILE_ROWS 16
#define W_CHUNK_BYTES (512 << 10)  // panels (as int8) read for each tile of rows
#define AMX_K 64  // k of one tdpbssd: a tile row of 64 bytes

// Tiles 0, 1: the high digits' int32 sums for two panels, 4, 5 the low digits'; 2, 7: x's high
// and low digits; 3, 6: the two panels' weights.
static void configure_quant(int rows, int step) {
  TileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  const int sums[4] = {0, 1, 4, 5}, digits[2] = {2, 7}, weights[2] = {3, 6};
  for (int i = 0; i < 4; i++) cfg.rows[sums[i]] = (uint8_t)rows, cfg.colsb[sums[i]] = 64;
  for (int i = 0; i < 2; i++) cfg.rows[digits[i]] = (uint8_t)rows, cfg.colsb[digits[i]] = step;
  for (int i = 0; i < 2; i++) cfg.rows[weights[i]] = (uint8_t)(step / 4), cfg.colsb[weights[i]] = 64;
  load_tile_config(&cfg);
}

// The granule's epilogue for rows [r0, r0 + rows) from the int32 tiles hi and lo.
static inline __attribute__((always_inline)) void amx_epilogue(const Shape *s,
                                                               const Activations *a, int64_t r0,
                                                               const int rows, const int32_t *hi,
                                                               const int32_t *lo, int64_t block,
                                                               __m512 ws, __m512 *acc) {
#pragma GCC unroll 16
  for (int r = 0; r < rows; r++) {
    const __m512 xe = _mm512_set1_ps(a->e[(r0 + r) * s->kblocks + block]);
    const __m512i sum = combine(_mm512_load_si512(hi + r * NR), _mm512_load_si512(lo + r * NR));
    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(xe, ws)));
  }
}

// Granule j's sums for the NP panels, both digits; each x tile read for both panels, each
// weight tile for both digits.
#define AMX_DP(j)                                                \
  do {                                                           \
    _tile_zero(0);                                               \
    _tile_zero(4);                                               \
    if (NP == 2) {                                               \
      _tile_zero(1);                                             \
      _tile_zero(5);                                             \
    }                                                            \
    for (int64_t h = (j) * G; h < ((j) + 1) * G; h += step) {    \
      _tile_loadd(2, x + h, 2 * k);                              \
      _tile_loadd(7, x + k + h, 2 * k);                          \
      _tile_loadd(3, b[0] + h * NR, 64);                         \
      _tile_dpbssd(0, 2, 3);                                     \
      _tile_dpbssd(4, 7, 3);                                     \
      if (NP == 2) {                                             \
        _tile_loadd(6, b[1] + h * NR, 64);                       \
        _tile_dpbssd(1, 2, 6);                                   \
        _tile_dpbssd(5, 7, 6);                                   \
      }                                                          \
    }                                                            \
  } while (0)

// Rows [r0, r0 + rows) against NP (1 or 2) panels, a granule at a time: a granule's sums are
// stored, the next granule is issued, then the stored sums' epilogue runs while the tiles work.
// out: [NP][rows][16].
static inline __attribute__((always_inline)) void amx_rows(const Shape *s,
                                                           const Activations *a, int64_t r0,
                                                           const int rows,
                                                           const uint8_t *const *panel,
                                                           const int8_t *const *b, float *out,
                                                           const int NP) {
  __m512 acc[2][TILE_ROWS], ws[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  int32_t c[2][2][TILE_ROWS * NR] __attribute__((aligned(64)));  // [panel][hi, lo]
  for (int p = 0; p < NP; p++)
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++) acc[p][r] = _mm512_setzero_ps();
  const int64_t G = s->granule, per_group = s->group / G, k = s->k, total = k / G;
  const int64_t step = G < AMX_K ? G : AMX_K;
  const int8_t *x = a->xq + r0 * 2 * k;
  AMX_DP(0);
  for (int64_t j = 0; j < total; j++) {
    _tile_stored(0, c[0][0], 64);
    _tile_stored(4, c[0][1], 64);
    if (NP == 2) {
      _tile_stored(1, c[1][0], 64);
      _tile_stored(5, c[1][1], 64);
    }
    if (j + 1 < total) AMX_DP(j + 1);
    const int64_t g = j / per_group, gi = j % per_group;
    for (int p = 0; p < NP; p++) {
      const uint8_t *scales = panel[p] + s->int_bytes;
      if (gi == 0) ws[p] = load_params(s, scales, g * NR);
      amx_epilogue(s, a, r0, rows, c[p][0], c[p][1], j, ws[p], acc[p]);
      if (s->has_mins && gi == per_group - 1) {
        const __m512 wm = load_params(s, scales + s->mins_offset, g * NR);
#pragma GCC unroll 16
        for (int r = 0; r < rows; r++)
          acc[p][r] = _mm512_add_ps(
              acc[p][r], _mm512_mul_ps(wm, _mm512_set1_ps(a->xsum[(r0 + r) * s->groups + g])));
      }
    }
  }
  for (int p = 0; p < NP; p++)
#pragma GCC unroll 16
    for (int r = 0; r < rows; r++) _mm512_store_ps(out + (p * TILE_ROWS + r) * NR, acc[p][r]);
}

// A whole tile of rows, or fewer; one panel or two.
#define AMX_ROWS(NAME, ROWS, NP)                                                               \
  static void NAME(const Shape *s, const Activations *a, int64_t r0, int rows,                 \
                   const uint8_t *const *panel, const int8_t *const *b, float *out) {          \
    (void)rows;                                                                                \
    amx_rows(s, a, r0, ROWS, panel, b, out, NP);                                               \
  }
AMX_ROWS(amx_rows_16_1, TILE_ROWS, 1)
AMX_ROWS(amx_rows_16_2, TILE_ROWS, 2)
AMX_ROWS(amx_rows_tail_1, rows, 1)
AMX_ROWS(amx_rows_tail_2, rows, 2)

// 4-bit panel -> its int8 quads [k / 4][16][4] in b.
static void widen_panel(const Shape *s, const uint8_t *panel, int8_t *b) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t i = 0; i < s->k / 8; i++) {
    const __m512i w = _mm512_loadu_si512((const void *)(panel + i * 64));
    _mm512_store_si512((void *)(b + 2 * i * 64), _mm512_and_si512(w, low));
    _mm512_store_si512((void *)(b + (2 * i + 1) * 64),
                       _mm512_and_si512(_mm512_srli_epi16(w, 4), low));
  }
}

// As linear_quant, on AMX tiles, two digits only (1 for one); 3 where Linux grants no tiles.
int linear_quant_amx(void *y, int y_bf16, int64_t ldy, const void *x, int x_bf16, int64_t ldx,
                     const uint8_t *w_packed, const float *bias, int64_t m, int64_t n, int64_t k,
                     int bits, int64_t group, int has_mins, int half, int num_threads,
                     int digits) {
  if (!valid(bits, group, k) || digits != 2) return 1;
  if (request_tiles()) return 3;
  const Shape s = shape_of(n, k, bits, group, has_mins, half);
  const int64_t panels = (n + NR - 1) / NR, quad_bytes = k * NR;  // a panel's ints as int8
  const int64_t chunk = W_CHUNK_BYTES / quad_bytes > 1 ? W_CHUNK_BYTES / quad_bytes : 1;
  int threads = num_threads < 1 ? 1 : num_threads;
  if (threads > panels) threads = (int)panels;
  Activations a;
  int8_t *widened =
      bits == 4 ? aligned_alloc(64, (size_t)(chunk * quad_bytes) * (size_t)threads) : NULL;
  if (quantize_activations(x, x_bf16, ldx, m, &s, 0, num_threads, &a) || (bits == 4 && !widened)) {
    free_activations(&a), free(widened);
    return 2;
  }
  const Out o = {y, y_bf16, ldy, bias};
  const int64_t block_rows = gemm_block_rows(X_BLOCK_BYTES, 2 * k, TILE_ROWS);
  const int step = s.granule < AMX_K ? (int)s.granule : AMX_K;
#pragma omp parallel num_threads(threads)
  {
    GEMM_THREAD_IDS;
    const int64_t q0 = panels * t / nt, q1 = panels * (t + 1) / nt;
    float out[2 * TILE_ROWS * NR] __attribute__((aligned(64)));
    int8_t *b = widened == NULL ? NULL : widened + t * chunk * quad_bytes;
    int configured = -1;
    // A chunk of panels (W_CHUNK_BYTES, in L2) against each tile of rows in turn: a tile of x
    // is read once a chunk, not once a panel.
    for (int64_t m0 = 0; m0 < m; m0 += block_rows) {
      const int64_t m1 = m0 + block_rows < m ? m0 + block_rows : m;
      for (int64_t from = q0; from < q1; from += chunk) {
        const int64_t to = from + chunk < q1 ? from + chunk : q1;
        if (bits == 4)
          for (int64_t q = from; q < to; q++)
            widen_panel(&s, w_packed + q * s.panel_bytes, b + (q - from) * quad_bytes);
        for (int64_t r = m0; r < m1; r += TILE_ROWS) {
          const int rows = m1 - r < TILE_ROWS ? (int)(m1 - r) : TILE_ROWS;
          if (rows != configured) configure_quant(rows, step), configured = rows;
          for (int64_t q = from; q < to; q += 2) {
            const int np = to - q < 2 ? 1 : 2;
            const uint8_t *panel[2] = {w_packed + q * s.panel_bytes,
                                       w_packed + (q + np - 1) * s.panel_bytes};
            const int8_t *quads[2];
            for (int p = 0; p < 2; p++)
              quads[p] = bits == 4 ? b + (q + (p < np ? p : 0) - from) * quad_bytes
                                   : (const int8_t *)panel[p];
            if (rows == TILE_ROWS && np == 2)
              amx_rows_16_2(&s, &a, r, rows, panel, quads, out);
            else if (rows == TILE_ROWS)
              amx_rows_16_1(&s, &a, r, rows, panel, quads, out);
            else if (np == 2)
              amx_rows_tail_2(&s, &a, r, rows, panel, quads, out);
            else
              amx_rows_tail_1(&s, &a, r, rows, panel, quads, out);
            for (int p = 0; p < np; p++)
              store_rows(&o, &s, out + p * TILE_ROWS * NR, r, rows, (q + p) * NR);
          }
        }
      }
    }
    _tile_release();
  }
  free_activations(&a), free(widened);
  return 0;
}
#endif
