#pragma once
// Call-free float math for the CPU kernels, so the loops that use it vectorize.
#include <stdint.h>
#include <string.h>

// exp(x) for x <= 0 as 2^n * p(r), r = x - n ln 2, |r| <= ln 2 / 2: Cephes' expf polynomial,
// within 2 ulp of expf. Below -80 the result is 0 (exp(-80) ~ 1.8e-35 beside the softmax's
// largest term, 1): a smaller one, weighing a value below 1, would make a subnormal product,
// and every FMA that meets a subnormal takes a microcode assist of ~100 cycles (ALiBi's far
// keys, 0.5 * -250, made the prefill kernel 5x slower). The polynomial runs on x held at -87
// or above, so 2^n stays a normal float.
static inline float exp_nonpositive(float x) {
  const float y = x < -87.0f ? -87.0f : x;
  const float n = __builtin_roundf(y * 1.44269504088896341f);
  const float r = y - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  return x < -80.0f ? 0.0f : p * two_n;
}

// A bfloat16 (the upper half of a float32) widened to float32: exact.
static inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

// Round to nearest even, as torch's .to(torch.bfloat16) does; NaN stays NaN.
static inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
  return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// 8-bit floats of the KV cache, as torch.float8_e4m3fn (OCP E4M3: bias 7, no infinities, S.1111.111
// is NaN, largest 448) and torch.float8_e5m2 (bias 15: the upper byte of a float16, largest 57344).
// Widening is exact. Narrowing saturates to the largest finite value (as vLLM's kernels; a plain
// cast in torch gives NaN or inf) and rounds to nearest even, as torch's cast of the clamped
// value; integer arithmetic only, so no compiler flag can change a result.
static inline float float_of_bits(uint32_t bits) {
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

// An fp8 subnormal m * 2^scale_exp (a normal float32 for m > 0), signed by bits.
static inline float fp8_subnormal_value(uint32_t sign, uint32_t m, float scale) {
  uint32_t bits;
  const float v = (float)m * scale;
  memcpy(&bits, &v, sizeof bits);
  return float_of_bits(sign | bits);
}

static inline float e4m3_to_float(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return float_of_bits(sign | 0x7fc00000u);
  if (e == 0) return fp8_subnormal_value(sign, m, 0x1p-9f);
  return float_of_bits(sign | (e + 120) << 23 | m << 20);
}

static inline float e5m2_to_float(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 2) & 31, m = b & 3;
  if (e == 31) return float_of_bits(sign | (m ? 0x7fc00000u : 0x7f800000u));
  if (e == 0) return fp8_subnormal_value(sign, m, 0x1p-16f);
  return float_of_bits(sign | (e + 112) << 23 | m << 21);
}

// A finite |f| (its bits) below the format's smallest normal as a count of its subnormal steps,
// 2^(min_exp - mant_bits) each, rounded to nearest even (a count of 2^mant_bits is the smallest
// normal, whose code it also is).
static inline uint32_t fp8_subnormal_code(uint32_t abs_bits, int min_exp, int mant_bits) {
  const int e = (int)(abs_bits >> 23);
  if (e == 0) return 0;  // a float32 subnormal: far below half the smallest fp8 subnormal
  const uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u;  // |f| = mant * 2^(e - 150)
  const int shift = 150 + min_exp - mant_bits - e;  // >= 1 below the smallest normal
  if (shift >= 32) return 0;
  const uint32_t q = mant >> shift, r = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  return q + (r > half || (r == half && (q & 1)));
}

// f as an fp8 with exponent bias `bias` and mant_bits mantissa bits, whose largest finite value
// is max_bits as a float32 (max_code as fp8) and whose NaN is nan_code.
static inline uint8_t float_to_fp8(float f, int bias, int mant_bits, uint32_t max_bits,
                                   uint8_t max_code, uint8_t nan_code) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  const uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | nan_code;
  if (abs_bits >= max_bits) return sign | max_code;
  if (abs_bits < (uint32_t)(128 - bias) << 23)
    return sign | (uint8_t)fp8_subnormal_code(abs_bits, 1 - bias, mant_bits);
  const int drop = 23 - mant_bits;
  const uint32_t odd = (abs_bits >> drop) & 1;
  const uint32_t rebiased = abs_bits - ((uint32_t)(127 - bias) << 23);
  return sign | (uint8_t)((rebiased + (1u << (drop - 1)) - 1 + odd) >> drop);
}

static inline uint8_t float_to_e4m3(float f) {
  return float_to_fp8(f, 7, 3, 0x43e00000u /* 448 */, 0x7e, 0x7f);
}
static inline uint8_t float_to_e5m2(float f) {
  return float_to_fp8(f, 15, 2, 0x47600000u /* 57344 */, 0x7b, 0x7f);
}
