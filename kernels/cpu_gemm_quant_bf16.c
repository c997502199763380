// Matmul over 4- and 8-bit weights for models computing in bfloat16: y[M, N] = x[M, K] @ W[N, K]^T
// (+ bias), x, bias and y bfloat16, with the bits of the dense bfloat16 path on the dequantized
// weight
//
//     W_bf16[n, k] = bfloat16(q[n, k] * scale[n, g] (+ min[n, g]))   (float32, product then sum,
//                                                                      to nearest even)
//
// while W streams from memory at its stored size. Two builds: on AMX tiles (the dense path is
// cpu_gemm_amx.c's) and, where there are none, on AVX512_BF16 dot products (the dense path is
// cpu_gemm_bf16.c's).
//
// AMX. The weight is the A operand and x the B one: y^T = W x^T. An A tile is 16 output columns by
// 32 k, one column a row, so a column's 32 4-bit weights of one group are one table lookup: its
// 16 possible bfloat16 values (q = 0..15) computed from its scale and minimum, then one vpermw by
// its nibbles (shifted down from the words its quad of columns shares); 8-bit weights are widened
// and scaled 16 at a time. tdpbf16ps sums each element's products in the same order whichever
// operand holds W (its products are exact and its sums run over k pairs in order; checked bit for
// bit in the tests), so y is the dense kernel's. x is packed once a call into B tiles of 16 k
// pairs by 16 rows ([row tile][k step][16][16][2]), rows past M zero.
//
// Threads split the panels. Rows of x go in passes whose x^T stays in L2 (XT_BLOCK_BYTES), four
// row tiles at a time (four B tiles, four float32 C tiles of 16 columns by 16 rows). A panel's k
// steps are dequantized AHEAD steps before their tile steps, into a small ring (or, where a pass
// has more than four row tiles, into keep, which its other row tiles then read), so W's integers
// stream in by ordinary loads, which do not wait on the tiles. Prompts
// (linear_quant_bf16_amx_dense) run the dense kernel's passes (amx_gemm.h) over the weight
// dequantized a chunk at a time.
//
// AVX512_BF16 (linear_quant_bf16_dot): each thread dequantizes the units of panels it takes, the
// same values as the tiles take, transposed into cpu_gemm_bf16.c's layout in a scratch of its own
// (a decode batch: one unit at a time, for all its rows; a prompt: a chunk of GEMM_CHUNK_BYTES at
// a time, for every block of rows), and runs the dense kernel's micro-kernel (bf16_dot.h) there.
//
// W is packed once, at load, into panels of 16 output columns (zero past N), each one stream:
//
//     panel p, for each group g: 4 bits: [group / 32][4][32] uint16 (a k step of 32, its columns
//                                in quads: word i of quad c holds k = i of column 4c + t in bits
//                                4t .. 4t + 3, so one load serves four columns' lookups, each
//                                its own shift); 8 bits: [group / 32][16][32] int8 (column j's k)
//                                scales [16] float32, then mins [16] float32 (with mins)
//
// Built with -ffp-contract=off (the product and the sum of a dequantized value round apart).

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_gemm_loop.h"

#if defined(__AVX512BF16__)
#include "bf16_dot.h"
#define SUPPORTED 1
#else
#define SUPPORTED 0
#endif
#if SUPPORTED && defined(__AMX_BF16__)
#include "amx_gemm.h"
#else
#define KB 32  // k a tile step (amx_gemm.h's)
#define NR 16
#endif

#define DOT_X_BLOCK_BYTES (4 << 20)  // x read per pass over W on dot products (cpu_gemm_bf16.c's)
#define SUB_TILES 4  // row tiles of x the tile steps take at once: four B tiles, four sums
#define TILE_BYTES 1024
#define XT_BLOCK_BYTES (1 << 20)  // x^T read per pass over W
#define AHEAD 2          // k steps a step's A tile is dequantized before its tile steps
#define RING (AHEAD + 2)  // A tiles in the scratch ring
#define PF_AHEAD 2048     // bytes of W ahead of a k step's that it prefetches

typedef struct {
  int64_t k, group, groups, step_bytes, group_bytes, panel_bytes;  // step: a k step's integers
  int bits, has_mins;
} Shape;

static Shape shape_of(int64_t k, int bits, int64_t group, int has_mins) {
  Shape s;
  s.k = k, s.bits = bits, s.group = group, s.groups = k / group, s.has_mins = has_mins;
  s.step_bytes = NR * KB * bits / 8;
  s.group_bytes = group / KB * s.step_bytes + NR * (int64_t)sizeof(float) * (1 + has_mins);
  s.panel_bytes = s.groups * s.group_bytes;
  return s;
}

// 1 where this build computes (AVX512_BF16; the AMX entry points too where built with tiles).
int cpu_gemm_quant_bf16_supported(void) { return SUPPORTED; }

int64_t quant_bf16_panel_bytes(int64_t k, int bits, int64_t group, int has_mins) {
  return shape_of(k, bits, group, has_mins).panel_bytes;
}

static int valid(int64_t k, int bits, int64_t group) {
  return (bits == 4 || bits == 8) && group > 0 && group % KB == 0 && k % group == 0;
}

// out [ceil(n / 16)][panel_bytes] from q (4 bits: uint8 [n, k / 2], k even in the low nibble of
// byte k / 2, odd in the high one; 8 bits: int8 [n, k]), scales and mins (or NULL) float32 [n, k /
// group]. Returns 0, or 1 for other bits or a group that is no multiple of 32 or does not divide k.
int pack_weight_quant_bf16(uint8_t *out, const uint8_t *q, const float *scales, const float *mins,
                           int64_t n, int64_t k, int bits, int64_t group) {
  if (!valid(k, bits, group)) return 1;
  const Shape s = shape_of(k, bits, group, mins != NULL);
  const int64_t panels = (n + NR - 1) / NR;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; p++) {
    uint8_t *panel = out + p * s.panel_bytes;
    memset(panel, 0, (size_t)s.panel_bytes);
    for (int64_t g = 0; g < s.groups; g++) {
      uint8_t *ints = panel + g * s.group_bytes;
      float *sc = (float *)(ints + group / KB * s.step_bytes), *mn = sc + NR;
      for (int j = 0; j < NR && p * NR + j < n; j++) {
        const int64_t row = p * NR + j;
        sc[j] = scales[row * s.groups + g];
        if (mins != NULL) mn[j] = mins[row * s.groups + g];
        for (int64_t c = 0; c < group / KB; c++) {
          uint8_t *step = ints + c * s.step_bytes;
          const int64_t k0 = g * group + c * KB;
          if (bits == 8) {
            memcpy(step + j * KB, q + row * k + k0, KB);
            continue;
          }
          // Word i of column j's quad holds its k0 + i in bits 4 (j % 4) .. 4 (j % 4) + 3.
          const uint8_t *qr = q + row * (k / 2);
          uint16_t *words = (uint16_t *)(step + j / 4 * 64);
          for (int i = 0; i < KB; i++) {
            const int64_t kk = k0 + i;
            const uint16_t v = (qr[kk / 2] >> (4 * (kk % 2))) & 0xF;
            words[i] |= (uint16_t)(v << (4 * (j % 4)));
          }
        }
      }
    }
  }
  return 0;
}

#if SUPPORTED

// Column j's table: its 16 bfloat16 values, twice (so an index's bit 4 may be anything), from its
// group's scales sc and mins mn (NULL: none).
static inline __attribute__((always_inline)) __m512i column_table(const float *sc, const float *mn,
                                                                  int j) {
  const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 v = _mm512_mul_ps(levels, _mm512_set1_ps(sc[j]));
  if (mn != NULL) v = _mm512_add_ps(v, _mm512_set1_ps(mn[j]));
  return (__m512i)_mm512_cvtne2ps_pbh(v, v);
}

// Row j of a k step's A tile (column j's 32 weights) at out, looked up in its table by the 32
// words of its quad of columns shifted down 4 (j % 4): bits 0-3 its nibble, bit 4 the next
// column's (the table's two halves are alike).
static inline __attribute__((always_inline)) void lookup_row(__m512i quad, int j, __m512i table,
                                                             uint16_t *out) {
  const __m512i index = j % 4 == 0 ? quad : _mm512_srli_epi16(quad, 4 * (j % 4));
  _mm512_store_si512((__m512i *)out, _mm512_permutexvar_epi16(index, table));
}

// Row j of a k step's A tile from column j's 32 8-bit integers: widened, scaled (and offset) in
// float32, rounded to bfloat16.
static inline __attribute__((always_inline)) void scale_row(const int8_t *q, const float *sc,
                                                            const float *mn, int j,
                                                            uint16_t *out) {
  const __m512 d = _mm512_set1_ps(sc[j]);
  const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
  const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
  __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
  __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
  if (mn != NULL) {
    const __m512 m = _mm512_set1_ps(mn[j]);
    lo = _mm512_add_ps(lo, m), hi = _mm512_add_ps(hi, m);
  }
  _mm512_store_si512((__m512i *)out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// The A tile of a k step at out (1 KB): 16 rows, one a column, of 32 bfloat16 weights, from the
// step's integers. 4-bit groups of 32 build each column's table where they use it; larger ones
// keep a group's 16 tables in tables (built at its first step, first_step) for its other steps.
static inline __attribute__((always_inline)) void dequantize_tile(const Shape *s,
                                                                  const uint8_t *ints,
                                                                  const float *sc, const float *mn,
                                                                  int first_step,
                                                                  __m512i tables[NR],
                                                                  uint16_t *out) {
  const int64_t group = s->group;
  if (s->bits == 8) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; j++) scale_row((const int8_t *)ints + j * KB, sc, mn, j, out + j * KB);
    return;
  }
#pragma GCC unroll 16
  for (int j = 0; j < NR; j++) {
    const __m512i quad = _mm512_loadu_si512((const void *)(ints + j / 4 * 64));
    if (group == KB) {
      lookup_row(quad, j, column_table(sc, mn, j), out + j * KB);
    } else {
      if (first_step) tables[j] = column_table(sc, mn, j);
      lookup_row(quad, j, tables[j], out + j * KB);
    }
  }
}

// The 16 x 16 dwords at rows[0..15] transposed into t[0..15] (t[c] dword r = rows[r] dword c).
static inline void transpose16(const __m512i r[16], __m512i t[16]) {
  __m512i a[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  // u[4q + j], lane l: dword 4l + j of rows 4q .. 4q + 3
  for (int j = 0; j < 4; j++) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i w0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    t[j] = _mm512_shuffle_i32x4(v0, v1, 0x88);
    t[8 + j] = _mm512_shuffle_i32x4(v0, v1, 0xDD);
    t[4 + j] = _mm512_shuffle_i32x4(w0, w1, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(w0, w1, 0xDD);
  }
}

// Where a panel's dequantizing stands: the group of its next k step (its bytes), the step's place
// in the group, and (groups of 64 or more) the group's 16 tables.
typedef struct {
  const uint8_t *group;
  int64_t c;
  __m512i tables[NR];
} Cursor;

// The cursor's k step dequantized into the A tile at out, and the cursor on to the next step (no
// divisions on the way to its loads).
static inline __attribute__((always_inline)) void dequantize_next(const Shape *s, Cursor *at,
                                                                  uint16_t *out) {
  const float *sc = (const float *)(at->group + s->group / KB * s->step_bytes);
  const uint8_t *ints = at->group + at->c * s->step_bytes;
  for (int l = 0; l < s->step_bytes / 64 + 2; l++)  // W, PF_AHEAD on: its loads wait on nothing
    _mm_prefetch((const char *)(ints + PF_AHEAD + 64 * l), _MM_HINT_T0);
  dequantize_tile(s, ints, sc, s->has_mins ? sc + NR : NULL, at->c == 0, at->tables, out);
  if (++at->c == s->group / KB) at->c = 0, at->group += s->group_bytes;
}

// Panel p of the weight dequantized into cpu_gemm_bf16's layout at out ([k / 2][16][2] bfloat16,
// the same values the tiles above take).
static void unpack_panel(uint16_t *out, const uint8_t *w_packed, const Shape *s, int64_t p,
                         int64_t k) {
  uint16_t a[TILE_BYTES / 2] __attribute__((aligned(64)));
  __m512i rows[16], t[16];
  Cursor at = {.group = w_packed + p * s->panel_bytes, .c = 0};
  for (int64_t ks = 0; ks < k / KB; ks++) {
    dequantize_next(s, &at, a);
    for (int j = 0; j < 16; j++) rows[j] = _mm512_load_si512((const void *)(a + j * KB));
    transpose16(rows, t);  // a column's k pairs -> a k pair's columns
    uint16_t *dst = out + ks * (TILE_BYTES / 2);
    for (int i = 0; i < 16; i++) _mm512_storeu_si512((void *)(dst + i * 32), t[i]);
  }
}

// The packed weight a prompt's chunks are dequantized from (ChunkFill's ctx).
typedef struct {
  const uint8_t *w_packed;
  Shape s;
  int64_t panels;
} Packed;

// Panels [p0, p1) of the weight dequantized into cpu_gemm_bf16's layout at out, panel p0 first.
static void unpack_panels(uint16_t *out, const Packed *w, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1 && p < w->panels; p++)
    unpack_panel(out + (p - p0) * (w->s.k / 2 * NR * 2), w->w_packed, &w->s, p, w->s.k);
}

#ifdef __AMX_BF16__
// Pairs [q0, q1) of the weight's panels dequantized into cpu_gemm_bf16's layout at out, pair q0
// first (a ChunkFill).
static void unpack_pairs(uint16_t *out, const void *ctx, int64_t q0, int64_t q1) {
  unpack_panels(out, ctx, 2 * q0, 2 * q1);
}
#endif

// y [m, n] (rows ldy apart) on AVX512_BF16 dot products (see the top): the dense AVX512_BF16
// path's bits. Returns 0; 1 for bits or a group it does not take; 4 where no scratch memory is to
// be had.
int linear_quant_bf16_dot(uint16_t *y, int64_t ldy, const uint16_t *x, int64_t ldx,
                          const uint8_t *w_packed, const uint16_t *bias, int64_t m, int64_t n,
                          int64_t k, int bits, int64_t group, int has_mins, int num_threads) {
  if (!valid(k, bits, group)) return 1;
  const Packed w = {w_packed, shape_of(k, bits, group, has_mins), (n + NR - 1) / NR};
  const int unit = gemm_unit_panels(w.panels, gemm_threads(num_threads, w.panels));
  const int64_t units = (w.panels + unit - 1) / unit, panel_elems = k / 2 * NR * 2;
  const int64_t unit_bytes = unit * panel_elems * (int64_t)sizeof(uint16_t);
  const int64_t block_rows = gemm_block_rows(DOT_X_BLOCK_BYTES, k * (int64_t)sizeof(uint16_t), MR);
  const int threads = gemm_threads(num_threads, units);
  uint64_t shares[GEMM_MAX_THREADS];
  gemm_shares(shares, units, threads);
  int status = 0;
#pragma omp parallel num_threads(threads) reduction(| : status)
  {
    // a chunk of units (a decode batch's one block takes one unit a chunk)
    uint16_t *scratch = aligned_alloc(64, (size_t)(gemm_chunk_units(unit_bytes) * unit_bytes));
    if (scratch == NULL)
      status = 4;
    else
      GEMM_UNITS(units, unit_bytes, m, block_rows, shares, threads,
                 unpack_panels(scratch, &w, unit * chunk0, unit * chunk1), {
                   const uint16_t *panel = scratch + (q - chunk0) * unit * panel_elems;
                   dot_rows(y, ldy, x, ldx, panel, k, bias, n, q, unit, w.panels, m0, m1, NULL);
                 });
    free(scratch);
  }
  return status;
}

#endif  // SUPPORTED

#if SUPPORTED && defined(__AMX_BF16__)

// x's rows [16 rt, 16 rt + 16) (those below m; zeros past it), k step ks, as a B tile at out: k
// pair i of row r at out[(i * 16 + r) * 2].
static void pack_x_tile(uint16_t *out, const uint16_t *x, int64_t ldx, int64_t m, int64_t rt,
                        int64_t ks) {
  __m512i rows[16], t[16];
  for (int r = 0; r < 16; r++) {
    const int64_t row = rt * 16 + r;
    rows[r] = row < m ? _mm512_loadu_si512((const void *)(x + row * ldx + ks * KB))
                      : _mm512_setzero_si512();
  }
  transpose16(rows, t);
  for (int i = 0; i < 16; i++) _mm512_store_si512((__m512i *)(out + i * 32), t[i]);
}

// y rows [r0, r0 + rows) and columns [col, col + 16) clipped at n, from the float32 tile c (16
// columns by 16 rows): plus bias, rounded to bfloat16 once, as cpu_gemm_amx.c rounds.
static void store_columns(uint16_t *y, int64_t ldy, const uint16_t *bias, const float *c,
                          int64_t r0, int rows, int64_t col, int64_t n) {
  __m512i cols[16], t[16];
  for (int j = 0; j < 16; j++) cols[j] = _mm512_load_si512((const void *)(c + j * 16));
  transpose16(cols, t);
  const int64_t width = n - col < NR ? n - col : NR;
  const __mmask16 mask = (__mmask16)((1u << width) - 1);
  __m512 b = _mm512_setzero_ps();
  if (bias != NULL) {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, bias + col);
    b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  for (int r = 0; r < rows; r++) {
    const __m512 v = _mm512_add_ps(_mm512_castsi512_ps(t[r]), b);
    _mm256_mask_storeu_epi16(y + (r0 + r) * ldy + col, mask, (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// The tile steps of one panel against row tiles [rt, rt + tiles) of x^T (tiles <= 4): each k
// step's A tile dequantized into the scratch ring or, where keep is given, the step's slot of it;
// with from_keep, read from keep as an earlier call left it. Tiles 0-3: the sums of the row tiles;
// 4: A; 5 and 6: B, in turn.
static inline __attribute__((always_inline)) void panel_steps(
    const Shape *s, const uint8_t *panel, const uint16_t *xt, int64_t steps, int64_t rt,
    int tiles, uint16_t *scratch, uint16_t *keep, int from_keep) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  Cursor at = {.group = panel, .c = 0};
  // (A tile load finds its tile's stores long done.)
  for (int64_t ks = -AHEAD; ks < steps; ks++) {
    const int64_t d = ks + AHEAD;  // the step dequantized now
    if (!from_keep && d < steps)
      dequantize_next(s, &at, keep != NULL ? keep + d * (TILE_BYTES / 2)
                                           : scratch + (d % RING) * (TILE_BYTES / 2));
    if (ks < 0) continue;
    const uint16_t *a = keep != NULL ? keep + ks * (TILE_BYTES / 2)
                                     : scratch + (ks % RING) * (TILE_BYTES / 2);
    _tile_loadd(4, a, 64);
    const uint16_t *b = xt + (rt * steps + ks) * (TILE_BYTES / 2);
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 4, 5);
    if (tiles > 1) {
      _tile_loadd(6, b + steps * (TILE_BYTES / 2), 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if (tiles > 2) {
      _tile_loadd(5, b + 2 * steps * (TILE_BYTES / 2), 64);
      _tile_dpbf16ps(2, 4, 5);
    }
    if (tiles > 3) {
      _tile_loadd(6, b + 3 * steps * (TILE_BYTES / 2), 64);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
}

// y [m, n] (rows ldy apart) for prompt-sized x, which the dense AMX passes (amx_gemm.h) run
// faster than the tile steps here: each thread dequantizes a chunk of pairs of panels
// (GEMM_CHUNK_BYTES) into panels of its own and every block of x takes them from there, so the
// dequantized weight never goes to memory; the dense path's bits (the same values, the same
// passes). Returns 0; 1 for bits or a group it does not take; 3 where Linux grants no tiles; 4
// where no scratch memory is to be had.
int linear_quant_bf16_amx_dense(uint16_t *y, int64_t ldy, const uint16_t *x, int64_t ldx,
                                const uint8_t *w_packed, const uint16_t *bias, int64_t m,
                                int64_t n, int64_t k, int bits, int64_t group, int has_mins,
                                int num_threads) {
  if (!valid(k, bits, group)) return 1;
  if (request_tiles()) return 3;
  const Out o = {y, bias, NULL, NULL, n, k, ldy, 0};
  const Packed w = {w_packed, shape_of(k, bits, group, has_mins), (n + NR - 1) / NR};
  return amx_prompt(&o, x, ldx, NULL, unpack_pairs, &w, m, num_threads);
}

// Returns 0; 1 for bits or a group it does not take (a group is a multiple of 32, so k is); 3
// where Linux grants no tiles; 4 where no scratch memory is to be had.
int linear_quant_bf16_amx(uint16_t *y, int64_t ldy, const uint16_t *x, int64_t ldx,
                          const uint8_t *w_packed, const uint16_t *bias, int64_t m, int64_t n,
                          int64_t k, int bits, int64_t group, int has_mins, int num_threads) {
  if (!valid(k, bits, group)) return 1;
  if (request_tiles()) return 3;
  const Shape s = shape_of(k, bits, group, has_mins);
  const int64_t steps = k / KB, row_tiles = (m + 15) / 16, panels = (n + NR - 1) / NR;
  // Row tiles a pass: x^T's block stays in L2 (up to XT_BLOCK_BYTES) while each panel, dequantized
  // once a pass, serves all of them.
  int64_t pass_tiles = XT_BLOCK_BYTES / (16 * k * 2);
  pass_tiles = pass_tiles < SUB_TILES ? SUB_TILES : pass_tiles / SUB_TILES * SUB_TILES;
  const int keep_tiles = row_tiles > SUB_TILES;
  uint16_t *xt = aligned_alloc(64, (size_t)(row_tiles * steps * TILE_BYTES));
  if (xt == NULL) return 4;
  int threads = num_threads < 1 ? 1 : num_threads, status = 0;
#pragma omp parallel num_threads(threads) reduction(| : status)
  {
    GEMM_THREAD_IDS;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < row_tiles * steps; i++)
      pack_x_tile(xt + i * (TILE_BYTES / 2), x, ldx, m, i / steps, i % steps);
    configure_tiles();
    uint16_t scratch[RING * TILE_BYTES / 2] __attribute__((aligned(64)));  // a ring of A tiles
    float c[16 * 16] __attribute__((aligned(64)));
    uint16_t *keep = keep_tiles ? aligned_alloc(64, (size_t)(steps * TILE_BYTES)) : NULL;
    status = keep_tiles && keep == NULL;
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    for (int64_t pass = 0; pass < row_tiles && !status; pass += pass_tiles) {
      const int64_t pass_end = pass + pass_tiles < row_tiles ? pass + pass_tiles : row_tiles;
      for (int64_t p = p0; p < p1; p++) {
        const uint8_t *panel = w_packed + p * s.panel_bytes;
        for (int64_t rt = pass; rt < pass_end; rt += SUB_TILES) {
          const int tiles = pass_end - rt < SUB_TILES ? (int)(pass_end - rt) : SUB_TILES;
          panel_steps(&s, panel, xt, steps, rt, tiles, scratch, keep, rt != pass);
          for (int i = 0; i < tiles; i++) {
            if (i == 0) _tile_stored(0, c, 64);
            if (i == 1) _tile_stored(1, c, 64);
            if (i == 2) _tile_stored(2, c, 64);
            if (i == 3) _tile_stored(3, c, 64);
            const int64_t r0 = (rt + i) * 16;
            const int rows = m - r0 < 16 ? (int)(m - r0) : 16;
            store_columns(y, ldy, bias, c, r0, rows, p * NR, n);
          }
        }
      }
    }
    free(keep);
    _tile_release();
  }
  free(xt);
  return status ? 4 : 0;
}

#endif  // SUPPORTED && __AMX_BF16__
