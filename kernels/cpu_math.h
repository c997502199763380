#pragma once
// Call-free float math for the CPU kernels, so the loops that use it vectorize.
#include <stdint.h>
#include <string.h>

// exp(x) for x <= 0 as 2^n * p(r), r = x - n ln 2, |r| <= ln 2 / 2: Cephes' expf polynomial,
// within 2 ulp of expf. Below -87 the result is held at exp(-87) ~ 1.6e-38, a normal float:
// callers add it to 1 or weigh by it, where it is ~0, and no subnormal is ever produced.
static inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = __builtin_roundf(x * 1.44269504088896341f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
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
  return p * two_n;
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
