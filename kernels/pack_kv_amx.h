#pragma once
// A sequence's K and V for one kv head, from the paged cache into the layouts AMX tiles take
// (the prefill kernel's right-hand operands), bfloat16 pairs along each dot product and head_dim
// padded with zeros to dp (a multiple of 32):
//
//   Kp  [16 keys][dp / 32 tiles][16 dim pairs][16 keys][2]: S = Q K^T's right-hand tiles;
//   Vp  [32 keys][dp / 16 tiles][16 key pairs][16 dims][2]: O += P V's.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;

typedef struct {
  const bf16 *key_cache, *value_cache;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t *block_table;           // the sequence's
  int block_size;
  int64_t row_stride;  // elements from one token's row to the next: num_kv_heads * head_dim
  int64_t head;        // the kv head's first element in a row
  int head_dim, dp;
} PackedCache;

static inline const bf16 *packed_row(const PackedCache *c, const bf16 *cache, int t) {
  const int64_t slot = (int64_t)c->block_table[t / c->block_size] * c->block_size + t % c->block_size;
  return cache + slot * c->row_stride + c->head;
}

// Kp and Vp of keys [packed_from, end rounded up to 32); those before `from` or from `end` on
// are zeros and never read. Kp's tile rows gather a pair of dims from 16 keys (masked gathers
// skip the absent keys); Vp's interleave two keys' rows.
static void pack_kv(const PackedCache *c, int packed_from, int from, int end, bf16 *kp,
                    bf16 *vp) {
  static const bf16 zeros[256];
  static const int16_t interleave[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                         37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                         11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i pairs = _mm512_loadu_si512(interleave);
  const int d = c->head_dim, dp = c->dp, stop = (end + 31) / 32 * 32;
  for (int g = packed_from; g < stop; g += 16) {  // 16 keys: dp / 32 tiles of Kp
    int64_t offset[16];  // bytes from the cache's start to each key's row
    __mmask16 present = 0;
    for (int j = 0; j < 16; j++) {
      offset[j] = 0;
      if (g + j >= from && g + j < end) {
        offset[j] = (const char *)packed_row(c, c->key_cache, g + j) - (const char *)c->key_cache;
        present |= (__mmask16)(1u << j);
      }
    }
    const __m512i lo = _mm512_loadu_si512(offset), hi = _mm512_loadu_si512(offset + 8);
    uint32_t *kt = (uint32_t *)(kp + (int64_t)(g - packed_from) * dp);
    for (int r = d / 2; r < dp / 2; r++) memset(kt + (r / 16) * 256 + (r % 16) * 16, 0, 64);
    for (int r = 0; r < d / 2; r++) {  // a pair of dims: row r % 16 of tile r / 16
      const char *base = (const char *)c->key_cache + 4 * r;
      const __m256i z = _mm256_setzero_si256();
      const __m256i a0 = _mm512_mask_i64gather_epi32(z, (__mmask8)present, lo, base, 1);
      const __m256i a1 = _mm512_mask_i64gather_epi32(z, (__mmask8)(present >> 8), hi, base, 1);
      const __m512i row = _mm512_inserti64x4(_mm512_castsi256_si512(a0), a1, 1);
      _mm512_storeu_si512(kt + (r / 16) * 256 + (r % 16) * 16, row);
    }
  }
  for (int t = packed_from; t < stop; t += 2) {  // two keys: a row of each of dp / 16 tiles
    const bf16 *v[2];
    for (int j = 0; j < 2; j++)
      v[j] = t + j >= from && t + j < end ? packed_row(c, c->value_cache, t + j) : zeros;
    const int i = t - packed_from;
    bf16 *vt = vp + (int64_t)(i / 32) * 32 * dp + (i % 32) / 2 * 32;
    for (int col = d; col < dp; col += 16) memset(vt + (col / 16) * 512, 0, 64);
    for (int col = 0; col < d; col += 16) {
      const __m512i v0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(v[0] + col)));
      const __m512i v1 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(v[1] + col)));
      _mm512_storeu_si512(vt + (col / 16) * 512, _mm512_permutex2var_epi16(v0, pairs, v1));
    }
  }
}
