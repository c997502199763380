#pragma once
// The passes of the bfloat16 matmul on AMX tiles (cpu_gemm_amx.c's entry points run them over
// packed weights, cpu_gemm_quant_bf16.c over weights it dequantizes a chunk at a time):
// y[M, N] = x[M, K] @ W[N, K]^T (+ bias), x, W, bias and y in bfloat16, products summed in
// float32 by tdpbf16ps, y rounded once (to nearest even).
//
// W comes packed as cpu_gemm_bf16.c packs it: panels of 16 output columns, [K / 2][16][2] each, so
// 16 pairs of k of a panel (1 KB, contiguous) are one B tile, and 16 rows of x by 32 of k one A
// tile. K must be a multiple of 32 (every tile whole); the last rows' tiles are configured with
// as many rows as x has left.
//
// Threads split the panel pairs (32 columns). A decode batch is one block of x: each thread takes
// each of its pairs against every group of 32 rows of the block in turn, into four float32 tiles
// (2 x 2 of 16 x 16), then against the last, partial group, with the tiles configured for its
// rows and again for 32 at the next pair: at 33-61 rows 7-9 % faster (K = 2,048) than a second
// pass of the partial group over W from L2. A pair is read from memory once, for all the rows.
// A prompt (amx_prompt: more rows than a block holds) takes each thread's pairs a chunk
// (GEMM_CHUNK_BYTES) at a time, and the chunk in blocks of rows whose slices of k (SLICE_STEPS
// steps, 4 KB of a bfloat16 row) hold X_SLICE_BYTES of x: a block takes the chunk a slice at a
// time, each slice every pair of the chunk in turn and each pair every group of the block, the
// pairs' sums kept between slices. The block's slice of x stays in L2 across the chunk's pairs and
// a pair's slice across the block's groups, and a pair comes from memory once and from L3 for the
// later blocks. Against blocks of 1 MB of x each taking a pair whole: K = 8,192 1.10-1.15x at
// 200-3,072 rows, Llama-3-8B's down_proj (K = 14,336) 1.09-1.25x at 1,600, K up to 4,096 even;
// blocks of 1 MB of slices about the same, of 2 MB 0.78-0.86x (past L2), of 256 KB 0.89-0.9x.
// In a call of one block (a decode batch) a thread that is done with its own pairs takes the
// others' from their ends (gemm_take), so a core slowed by another process does not hold the
// call: with a busy loop on one of the two cores, 1.1-2.5x at 16-64 rows; on a quiet machine as
// fast as equal shares. A decode batch of up to BATCH_ROWS rows is one block where x fits
// X_BATCH_BYTES and a pair W_PAIR_BYTES: at K = 8,192, 96-128 rows read W once, not twice (3-15 %
// faster, cold). (At 4,096 rows oneDNN's AMX kernels are still 1.0-1.3x faster on
// SmolLM2's shapes; at decode batches this one is.) Where a block has several groups, they take
// a pair SLICE_STEPS k steps at a time, each group's sums stored and reloaded between slices (k in
// the same order: the same bits), so the later groups find the slice still in L2: at K = 8,192
// (a 512 KB pair beside up to 1 MB of x) 48-96 rows 6-11 % faster; at K = 2,048 one slice.
// Past K = 8,192, where one group of bfloat16 x would fill X_BLOCK_BYTES, a batch of up to
// SLICE_GROUPS groups (x from L3) is one block, W read once for all of them: K = 14,336 1.3x at
// 61 rows.
// Cold W: a tile load that waits on memory holds every later tile instruction, so a pair that
// only its first group's loads ask for streams in at their pace, and the other groups' compute
// comes on top. Every group (each slice of it) of a pass of PF_MIN_ROWS or more therefore asks its
// share of the next pair (up to PF_MAX_BYTES) into L2, a few lines between tile products
// (bunched, they would wait behind a tile load): 3-11 % faster at 24-512 rows at K = 2,048; about
// even at K = 8,192, whose 512 KB pairs and 1 MB of x fill L2; below 17 rows the hardware
// prefetcher alone streams faster (a 2-core KVM Sapphire Rapids-class Xeon).
// Each row's sums run over k in the same order whatever the batch, so rows never depend on it.
//
// float32 x over the same panels (linear_f32_amx, for a float32 model whose weights are all
// bfloat16 values): each row of x is split into three bfloat16 parts, hi + mid + lo, which hold
// its 24 bits of mantissa; each k step adds the three parts' products (exact in float32) to the
// same float32 tiles, and y is stored in float32. That is a float32 matmul of x and W (sums in
// float32, in an order of its own: not oneDNN's bits) at three times the bfloat16 tiles' work,
// still 1.6-2.3x the float32 FMA kernel's speed (cpu_gemm.c) over half its weight bytes.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "cpu_gemm_loop.h"

#define NR 16                    // output columns per panel (a tile's float32 row)
#define KB 32                    // k per tile
#define TILE_ELEMS (KB * NR)     // bfloat16 elements of a B tile: 16 pairs of 16 columns
#define X_BLOCK_BYTES (1 << 20)    // x of one block
#define X_BATCH_BYTES (2 << 20)    // ... or all of x, up to this, at up to BATCH_ROWS rows
#define X_SLICE_BYTES (512 << 10)  // a prompt's block: its rows' slices of k
#define BATCH_ROWS 128
#define W_PAIR_BYTES (512 << 10)  // the largest pair a decode batch reads once (K = 8,192)
#define PF_MAX_BYTES (128 << 10)  // of the next pair asked into L2 while a pair is read
#define PF_MIN_ROWS 17             // rows of a pass from which it asks (fewer: the stream alone)
#define SLICE_STEPS 64  // k steps of a pair that its groups take in turn (K = 2,048: 128 KB)
#define SLICE_GROUPS 8  // groups of a block that do (a block of 1 MB of x at K > 2,048 has <= 8)
#define PARTS 3                    // bfloat16 parts of a float32 x

typedef struct {
  uint16_t *y;  // bfloat16 out, or NULL for y32
  const uint16_t *bias;
  float *y32;  // float32 out (three parts of x a k step)
  const float *bias32;
  int64_t n, k;
  int64_t ldy;  // elements between rows of y
  int64_t part_stride;  // elements of x between its parts
} Out;

// Rows [r, r + rows) of y, columns [col, col + 32) clipped at n, from the float32 tiles c0 (the
// first 16) and c1 (the next 16, or NULL for none): plus bias, rounded to bfloat16, each row one
// store.
static void store_tiles(const Out *o, const float *c0, const float *c1, int64_t r, int rows,
                        int64_t col) {
  const int64_t cols = o->n - col < 2 * NR ? o->n - col : 2 * NR;
  const __mmask32 mask = (__mmask32)((1ull << cols) - 1);
  if (o->y32 != NULL) {
    const __mmask16 m0 = (__mmask16)mask, m1 = (__mmask16)(mask >> 16);
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (o->bias32 != NULL) {
      b0 = _mm512_maskz_loadu_ps(m0, o->bias32 + col);
      b1 = _mm512_maskz_loadu_ps(m1, o->bias32 + col + NR);
    }
    for (int i = 0; i < rows; i++) {
      float *out = o->y32 + (r + i) * o->ldy + col;
      _mm512_mask_storeu_ps(out, m0, _mm512_add_ps(_mm512_loadu_ps(c0 + i * NR), b0));
      if (c1 != NULL)
        _mm512_mask_storeu_ps(out + NR, m1, _mm512_add_ps(_mm512_loadu_ps(c1 + i * NR), b1));
    }
    return;
  }
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (o->bias != NULL) {
    const __m512i bias = _mm512_maskz_loadu_epi16(mask, o->bias + col);
    const __m256i lo = _mm512_castsi512_si256(bias), hi = _mm512_extracti64x4_epi64(bias, 1);
    b0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(lo), 16));
    b1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
  }
  for (int i = 0; i < rows; i++) {
    const __m512 lo = _mm512_add_ps(_mm512_loadu_ps(c0 + i * NR), b0);
    const __m512 hi = c1 == NULL ? b1 : _mm512_add_ps(_mm512_loadu_ps(c1 + i * NR), b1);
    const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
    _mm512_mask_storeu_epi16(o->y + (r + i) * o->ldy + col, mask, (__m512i)v);
  }
}

// Lines of W to ask into L2: [from, to) of a run whose line l is at base + 64 l, plus gap bytes
// from line split on (a slice of k of a pair: its steps in panel 0, then the same in panel 1).
typedef struct {
  const char *base;
  int64_t from, to, split, gap;
} Ahead;

// Lines [from, min(from + count, pf.to - pf.from)) of pf's. always_inline: GCC 12 takes a function
// that only prefetches for a const one and drops its calls.
static inline __attribute__((always_inline)) void prefetch_lines(Ahead pf, int64_t from,
                                                                 int64_t count) {
  const int64_t end = pf.to - pf.from, to = from + count < end ? from + count : end;
  for (int64_t l = pf.from + from; l < pf.from + to; l++)
    _mm_prefetch(pf.base + l * 64 + (l >= pf.split ? pf.gap : 0), _MM_HINT_T1);
}

// y rows [r, r + rows) for the panels b0 (and b1 when GB == 2) at column col, from x's rows a,
// lda bytes apart (their P parts pstride elements apart), in GA tiles of up to 16 rows (as
// configured), over k steps [k0, k1): the sums start at zero (k0 = 0) or from acc, and end in y
// (k1 the last) or in acc. pf: pf_lines lines of the next pair to ask into L2 over the steps, a
// few between each two tile products (NULL: none).
static inline __attribute__((always_inline)) void tiles(const Out *o, const uint16_t *a,
                                                        int64_t lda, int64_t pstride,
                                                        const uint16_t *b0, int64_t panel,
                                                        Ahead pf,
                                                        int64_t k0, int64_t k1, float *acc,
                                                        int64_t r, int rows, int64_t col,
                                                        float *c, const int GA, const int GB,
                                                        const int P) {
  const uint16_t *b1 = b0 + panel, *a1 = a + 16 * (lda / 2);
  const int64_t steps = k1 - k0;
  if (k0 == 0) {
    _tile_zero(0);
    if (GB == 2) _tile_zero(1);
    if (GA == 2) _tile_zero(2);
    if (GA == 2 && GB == 2) _tile_zero(3);
  } else {
    _tile_loadd(0, acc, NR * 4);
    if (GB == 2) _tile_loadd(1, acc + 256, NR * 4);
    if (GA == 2) _tile_loadd(2, acc + 512, NR * 4);
    if (GA == 2 && GB == 2) _tile_loadd(3, acc + 768, NR * 4);
  }
  // Each k step asks for its share of pf's lines, a quarter before each tile product.
  const int64_t pf_lines = pf.to - pf.from;
  const int64_t quarter = (pf_lines + 4 * steps - 1) / (4 * steps);
  for (int64_t i = k0; i < k1; i++) {
    const int64_t l = 4 * (i - k0) * quarter;
    _tile_loadd(6, b0 + i * TILE_ELEMS, NR * 4);
    if (GB == 2) _tile_loadd(7, b1 + i * TILE_ELEMS, NR * 4);
    for (int p = 0; p < P; p++) {
      _tile_loadd(4, a + p * pstride + i * KB, lda);
      if (p == 0) prefetch_lines(pf, l, quarter);
      _tile_dpbf16ps(0, 4, 6);
      if (p == 0) prefetch_lines(pf, l + 1 * quarter, quarter);
      if (GB == 2) _tile_dpbf16ps(1, 4, 7);
      if (GA == 2) _tile_loadd(5, a1 + p * pstride + i * KB, lda);
      if (p == 0) prefetch_lines(pf, l + 2 * quarter, quarter);
      if (GA == 2) _tile_dpbf16ps(2, 5, 6);
      if (p == 0) prefetch_lines(pf, l + 3 * quarter, quarter);
      if (GA == 2 && GB == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (k1 * KB < o->k) {
    _tile_stored(0, acc, NR * 4);
    if (GB == 2) _tile_stored(1, acc + 256, NR * 4);
    if (GA == 2) _tile_stored(2, acc + 512, NR * 4);
    if (GA == 2 && GB == 2) _tile_stored(3, acc + 768, NR * 4);
    return;
  }
  const int rows0 = rows < 16 ? rows : 16, rows1 = rows - rows0;
  _tile_stored(0, c, NR * 4);
  if (GB == 2) _tile_stored(1, c + 256, NR * 4);
  store_tiles(o, c, GB == 2 ? c + 256 : NULL, r, rows0, col);
  if (GA == 2) {
    _tile_stored(2, c, NR * 4);
    if (GB == 2) _tile_stored(3, c + 256, NR * 4);
    store_tiles(o, c, GB == 2 ? c + 256 : NULL, r + 16, rows1, col);
  }
}

// pair_rows for P parts of x a k step.
static inline __attribute__((always_inline)) void pair_tiles(
    const Out *o, const uint16_t *a, int64_t lda, int64_t pstride, const uint16_t *b0,
    int64_t panel, Ahead pf, int64_t k0, int64_t k1, float *acc, int64_t r,
    int rows, int64_t col, int gb, float *c, const int P) {
  if (rows > 16 && gb == 2)
    tiles(o, a, lda, pstride, b0, panel, pf, k0, k1, acc, r, rows, col, c, 2, 2, P);
  else if (rows > 16)
    tiles(o, a, lda, pstride, b0, panel, pf, k0, k1, acc, r, rows, col, c, 2, 1, P);
  else if (gb == 2)
    tiles(o, a, lda, pstride, b0, panel, pf, k0, k1, acc, r, rows, col, c, 1, 2, P);
  else
    tiles(o, a, lda, pstride, b0, panel, pf, k0, k1, acc, r, rows, col, c, 1, 1, P);
}

// y rows [r, r + rows) (up to 32, the tiles configured for them) for pair q (its panels 2 (q -
// wq) panels on from w_packed) from a, x's row r, lda elements between rows and pstride between
// parts, over k steps [k0, k1) (sums between slices in acc). This is call `group` of the
// `groups` that read the pair (or its slice) in turn: it asks its share of k steps [nk0, nk1) of
// pair `next`, the one read after it, into L2, so that W streams in while the tiles work (a tile
// load that waits on memory holds every later tile instruction, and prefetches bunched behind
// one wait with it). groups 0 or next < 0: none asks.
static inline void pair_rows(const Out *o, const uint16_t *a, int64_t lda, int64_t pstride,
                             const uint16_t *w_packed, int64_t wq, int64_t panels, int64_t panel,
                             int64_t q, int64_t next, int64_t nk0, int64_t nk1, int64_t k0,
                             int64_t k1, float *acc, int64_t r, int group, int groups, int rows,
                             float *c) {
  const int gb = panels - 2 * q < 2 ? 1 : 2;
  const uint16_t *b0 = w_packed + 2 * (q - wq) * panel;
  const int64_t col = 2 * q * NR;
  Ahead pf = {NULL, 0, 0, 0, 0};
  if (groups > 0 && next >= 0) {
    const int gb_next = panels - 2 * next < 2 ? 1 : 2;
    const int64_t split = (nk1 - nk0) * TILE_ELEMS * (int64_t)sizeof(uint16_t) / 64;
    int64_t lines = gb_next * split;
    if (lines > PF_MAX_BYTES / 64) lines = PF_MAX_BYTES / 64;
    pf.base = (const char *)(w_packed + 2 * (next - wq) * panel + nk0 * TILE_ELEMS);
    pf.from = lines * group / groups, pf.to = lines * (group + 1) / groups, pf.split = split;
    pf.gap = (panel - (nk1 - nk0) * TILE_ELEMS) * (int64_t)sizeof(uint16_t);
  }
  if (o->y32 != NULL)
    pair_tiles(o, a, lda * 2, pstride, b0, panel, pf, k0, k1, acc, r, rows, col, gb, c, PARTS);
  else
    pair_tiles(o, a, lda * 2, pstride, b0, panel, pf, k0, k1, acc, r, rows, col, gb, c, 1);
}

// Tiles 0-3: float32 sums for rows [0, 16) x panel 0, x panel 1, rows [16, 32) x panel 0, x panel
// 1; 4, 5: x's rows [0, 16), [16, 32); 6, 7: panels 0 and 1. rows: the rows of x at hand (up to
// 32); a tile past them has none, one across them only those, so no tile reads past x's end.
static void configure_rows(int rows) {
  TileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  const int first = rows < 16 ? rows : 16, second = rows - first;
  const uint8_t tile_rows[8] = {first, first, second, second, first, second, 16, 16};
  for (int t = 0; t < 8; t++) cfg.colsb[t] = tile_rows[t] ? 64 : 0, cfg.rows[t] = tile_rows[t];
  load_tile_config(&cfg);
}

// Pair q against every group of 32 of x's rows [m0, m1) (the last one partial) over k steps
// [k0, k1), group g's sums between slices at acc + 1,024 g, the tiles configured for each group's
// rows as they come (configured: the rows they are configured for). Group g is call call0 + g of
// the `calls` that read the pair in turn, each asking its share of k steps [nk0, nk1) of pair next
// (see pair_rows).
static void groups_pair(const Out *o, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                        int64_t wq, int64_t panels, int64_t panel, int64_t m0, int64_t m1,
                        int64_t q, int64_t next, int64_t nk0, int64_t nk1, int64_t k0, int64_t k1,
                        float *acc, int call0, int calls, float *c, int *configured) {
  const int64_t full_end = m0 + (m1 - m0) / 32 * 32;
  const int tail = (int)(m1 - full_end), full = (int)((full_end - m0) / 32);
  if (full_end > m0 && *configured != 32) configure_rows(32), *configured = 32;
  for (int g = 0; g < full; g++)
    pair_rows(o, x + (m0 + 32 * g) * ldx, ldx, o->part_stride, w_packed, wq, panels, panel, q,
              next, nk0, nk1, k0, k1, acc + g * 1024, m0 + 32 * g, call0 + g, calls, 32, c);
  if (tail) {
    if (*configured != tail) configure_rows(tail), *configured = tail;
    pair_rows(o, x + full_end * ldx, ldx, o->part_stride, w_packed, wq, panels, panel, q, next,
              nk0, nk1, k0, k1, acc + full * 1024, full_end, call0 + full, calls, tail, c);
  }
}

// Pair q against every group of x's rows [m0, m1), asking for pair next (< 0: none) while it
// streams in. Several groups take the pair a slice of k at a time (one slice: the whole of k).
static void block_pair(const Out *o, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                       int64_t panels, int64_t panel, int64_t m0, int64_t m1, int64_t q,
                       int64_t next, float *acc, float *c, int *configured) {
  const int groups = (int)((m1 - m0 + 31) / 32);
  const int sliced = groups > 1 && groups <= SLICE_GROUPS;
  const int64_t steps = o->k / KB, slice = sliced ? SLICE_STEPS : steps;
  const int64_t slices = (steps + slice - 1) / slice;
  // The (slice, group) calls of a pair, each asking its share of the next pair (0: none).
  const int calls = m1 - m0 >= PF_MIN_ROWS ? groups * (int)slices : 0;
  for (int64_t sl = 0; sl < slices; sl++) {
    const int64_t k0 = sl * slice, k1 = k0 + slice < steps ? k0 + slice : steps;
    groups_pair(o, x, ldx, w_packed, 0, panels, panel, m0, m1, q, next, 0, steps, k0, k1, acc,
                (int)sl * groups, calls, c, configured);
  }
}

// Pairs [q0, q1) of a thread's chunk (w_packed from pair wq) for x's rows [0, m) in blocks of
// block_rows: each block takes the chunk a slice of k at a time, each slice every pair of the
// chunk in turn and each pair every group of the block's rows, so the block's x of a slice stays
// in L2 for the chunk's pairs and a pair's slice in L2 for the block's groups.
static void chunk_blocks(const Out *o, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                         int64_t wq, int64_t panels, int64_t panel, int64_t q0, int64_t q1,
                         int64_t q_after, int64_t m, int64_t block_rows, float *acc, float *c,
                         int *configured) {
  const int64_t steps = o->k / KB, slices = (steps + SLICE_STEPS - 1) / SLICE_STEPS;
  const int max_groups = (int)((block_rows + 31) / 32);
  for (int64_t m0 = 0; m0 < m; m0 += block_rows) {
    const int64_t m1 = m0 + block_rows < m ? m0 + block_rows : m;
    const int calls = m1 - m0 >= PF_MIN_ROWS ? (int)((m1 - m0 + 31) / 32) : 0;
    for (int64_t sl = 0; sl < slices; sl++) {
      const int64_t k0 = sl * SLICE_STEPS, k1 = k0 + SLICE_STEPS < steps ? k0 + SLICE_STEPS : steps;
      for (int64_t q = q0; q < q1; q++) {
        // the pair read after this one: the chunk's next, or its first at the next slice or
        // block, or the one after the chunk (q_after < 0: none)
        int64_t next = q + 1, nk0 = k0, nk1 = k1;
        if (next == q1) {
          next = sl + 1 < slices || m1 < m ? q0 : q_after;
          nk0 = sl + 1 < slices ? k1 : 0;
          nk1 = nk0 + SLICE_STEPS < steps ? nk0 + SLICE_STEPS : steps;
        }
        groups_pair(o, x, ldx, w_packed, wq, panels, panel, m0, m1, q, next, nk0, nk1, k0, k1,
                    acc + (q - q0) * max_groups * 1024, 0, calls, c, configured);
      }
    }
  }
}

// y rows [0, m) for x's rows (their parts o->part_stride apart) as one block (a decode batch:
// W read once for all of them).
static void amx_linear(const Out *o, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                       int64_t m, int num_threads) {
  const int64_t panels = (o->n + NR - 1) / NR, pairs = (panels + 1) / 2, panel = o->k / 2 * NR * 2;
  const int64_t pair_bytes = 2 * panel * (int64_t)sizeof(uint16_t);
  const int threads = gemm_threads(num_threads, pairs);
  uint64_t shares[GEMM_MAX_THREADS];
  gemm_shares(shares, pairs, threads);
#pragma omp parallel num_threads(threads)
  {
    float c[2 * 16 * NR] __attribute__((aligned(64)));  // two tiles' sums
    float acc[SLICE_GROUPS * 4 * 16 * NR] __attribute__((aligned(64)));  // each group's 4 tiles
    int configured = -1;  // rows the tiles are configured for
    GEMM_UNITS(pairs, pair_bytes, m, m, shares, threads, (void)0, {
      block_pair(o, x, ldx, w_packed, panels, panel, m0, m1, q, q_next, acc, c, &configured);
    });
    _tile_release();
  }
}

// Rows of a prompt's block (chunk_blocks): as many as X_SLICE_BYTES of x's slices hold, elem_bytes
// bytes an element of x (all its parts), 32 at least.
static int64_t prompt_block_rows(int64_t k, int64_t elem_bytes) {
  const int64_t slice_k = k < SLICE_STEPS * KB ? k : SLICE_STEPS * KB;
  return gemm_block_rows(X_SLICE_BYTES, slice_k * elem_bytes, 32);
}

// Floats of chunk_blocks' sums between slices for a chunk of up to `units` pairs (none where k
// is one slice).
static int64_t prompt_acc_floats(int64_t k, int64_t block_rows, int64_t units) {
  return k > SLICE_STEPS * KB ? units * ((block_rows + 31) / 32) * 4 * 16 * NR : 0;
}

// A prompt's weights for a thread's chunk of pairs [q0, q1): where W is not packed bfloat16 (the
// quantized path), fill writes them into scratch (pair q0 first) from ctx.
typedef void (*ChunkFill)(uint16_t *scratch, const void *ctx, int64_t q0, int64_t q1);

// y rows [0, m) for prompt-sized x (more rows than a decode batch's one block), x in bfloat16,
// over w_packed, or (fill not NULL) over each chunk of pairs as fill writes it into a scratch of
// the thread's own, so that the chunk never goes to memory. Returns 0, or 4 where no scratch
// memory is to be had.
static int amx_prompt(const Out *o, const uint16_t *x, int64_t ldx, const uint16_t *w_packed,
                      ChunkFill fill, const void *ctx, int64_t m, int num_threads) {
  const int64_t panels = (o->n + NR - 1) / NR, pairs = (panels + 1) / 2, panel = o->k / 2 * NR * 2;
  const int64_t pair_bytes = 2 * panel * (int64_t)sizeof(uint16_t);
  const int64_t units = gemm_chunk_units(pair_bytes);
  const int64_t block_rows = prompt_block_rows(o->k, sizeof(uint16_t));
  const int64_t acc_floats = prompt_acc_floats(o->k, block_rows, units);
  int status = 0;
#pragma omp parallel num_threads(gemm_threads(num_threads, pairs)) reduction(| : status)
  {
    float c[2 * 16 * NR] __attribute__((aligned(64)));  // two tiles' sums
    int configured = -1;  // rows the tiles are configured for
    float *acc = acc_floats ? aligned_alloc(64, acc_floats * sizeof(float)) : NULL;
    uint16_t *scratch = fill ? aligned_alloc(64, (size_t)(units * pair_bytes)) : NULL;
    if ((acc_floats && acc == NULL) || (fill && scratch == NULL))
      status = 4;
    else
      GEMM_CHUNKS(pairs, pair_bytes, {
        if (fill) fill(scratch, ctx, chunk0, chunk1);
        // a filled chunk's pairs lie from chunk0 on, and the next chunk is not there yet
        chunk_blocks(o, x, ldx, fill ? scratch : w_packed, fill ? chunk0 : 0, panels, panel,
                     chunk0, chunk1, fill ? -1 : chunk_after, m, block_rows, acc, c, &configured);
      });
    free(scratch);
    free(acc);
    _tile_release();
  }
  return status;
}

// Rows of one block: a decode batch's, read W once (up to BATCH_ROWS rows whose x, x_row_bytes
// each, fits X_BATCH_BYTES), else as many as X_BLOCK_BYTES of x hold. More rows than that are a
// prompt's (bfloat16 x: amx_prompt) or take several blocks (float32 x's parts).
static int64_t block_rows_for(int64_t m, int64_t x_row_bytes, int64_t k) {
  const int64_t pair_bytes = 2 * (k / 2 * NR * 2) * (int64_t)sizeof(uint16_t);
  int64_t block_rows = gemm_block_rows(X_BLOCK_BYTES, x_row_bytes, 32);
  // Where one group's x fills the block (bfloat16 x at K > 8,192), SLICE_GROUPS groups share each
  // pair a slice at a time, their x from L3: W read once for them, not once a group, where a
  // group's x is no more bytes than the pair (float32 x's three parts are more).
  if (k > SLICE_STEPS * KB && block_rows <= 32 && 32 * x_row_bytes <= pair_bytes)
    block_rows = SLICE_GROUPS * 32;
  const int one_pass =
      m <= BATCH_ROWS && m * x_row_bytes <= X_BATCH_BYTES && pair_bytes <= W_PAIR_BYTES;
  return one_pass && block_rows < m ? m : block_rows;
}
