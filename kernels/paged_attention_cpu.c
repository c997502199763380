// Paged decode attention for the CPU: one query row per sequence, K/V read through the block
// table in place, one pass over each (sequence, kv head) for all the query heads that share it
// (GQA). Two passes over the context: scores (q . k) for every token, VW keys at a time summed by
// one transpose-and-add tree, then softmax, then the weighted sum of V rows, each row loaded once
// for up to 4 query heads. q and the output are float32 or bfloat16 (widened, and rounded at
// the end), the scores and sums float32; the cache is float32, bfloat16, float16 or an 8-bit
// float (E4M3, E5M2), widened to float32 exactly as it is loaded (bfloat16 by a shift; float16
// and the 8-bit floats by the F16C conversion where the target has it). With AVX512_BF16,
// bfloat16 keys take dot-product instructions instead, over q rounded to bfloat16 (a bfloat16
// model's q already is).
// The blocks of a context lie anywhere in the pool, so the kernel prefetches them itself. Where a
// sequence has several kv heads of small groups, paged_attention_heads_cpu.h takes them together
// instead, reading each block's rows whole.
//
// Cache layout, shared with the CUDA kernels and the torch backend:
//
//   key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]   (contiguous)
//   token t of sequence s lives in block block_tables[s][t / block_size], row t % block_size
//
// Only rows t < context_len are read: a partly filled block's tail, and blocks no sequence owns,
// may hold anything (even NaN) without changing a result. With a sliding window (> 0), only
// rows context_len - sliding_window <= t are read: the blocks before the window's first block
// may have been freed (their block table entries are never read). With softcap (> 0), scores
// become softcap * tanh(scores / softcap) before the softmax (Gemma 2). With sinks (not NULL: one
// logit per query head, gpt-oss), each head's softmax also counts exp(sinks[h]) in its
// denominator, a key whose value is zero. With alibi_slopes (not NULL: one per query head, BLOOM,
// MPT), head h's score of row t gains alibi_slopes[h] * (t - (context_len - 1)).
//
// Work is split into contiguous runs of (sequence, kv head) units of about equal context length,
// one per OpenMP thread. pagedgen.kernels.cpu compiles this file on first use with -fopenmp after
// torch is loaded, so libgomp.so.1 resolves to the copy torch already runs: one thread pool for
// the matmuls and this kernel (a second pool would spin against torch's on the same cores).
// -O3 -march=native with reassociation allowed, so the reductions vectorize, but not
// -ffast-math, whose crtfastmath would turn on flush-to-zero for the whole process.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_scores_cpu.h"
#include "cpu_math.h"
#include "cpu_vec.h"

#define MAX_THREADS 256
#define MAX_GROUP 128  // query heads per kv head (DeepSeek-V3's MLA: 128 to its one latent)
#define PF_DIST 2     // blocks ahead that K is prefetched (see prefetch_block)

typedef struct {
  void *out;           // [num_seqs, num_heads, head_dim], contiguous
  const void *query;   // [num_seqs, num_heads, head_dim], rows query_seq_stride apart
  const void *key_cache;
  const void *value_cache;
  const int32_t *block_tables;  // [num_seqs, block_table_stride]
  const int32_t *context_lens;  // [num_seqs]
  int64_t query_seq_stride;
  int64_t block_table_stride;
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int sliding_window;  // 0: the whole context
  float softcap;       // 0: none
  const float *sinks;  // [num_heads] or NULL
  const float *alibi_slopes;     // [num_heads] or NULL
  int64_t unit_begin, unit_end;  // units: seq * num_kv_heads + kv_head
  int act_bf16;                   // query and out: 0 float32, 1 bfloat16
} Work;

#include "paged_attention_unit_cpu.h"

#define QK_KEYS_ALL(KV) \
  QK_KEYS(KV, 64) QK_KEYS(KV, 80) QK_KEYS(KV, 96) QK_KEYS(KV, 128) QK_KEYS(KV, 256) \
  QK_KEYS(KV, 576)
#define ATTEND_UNITS(KV, QK)                                                                  \
  V_TILE(KV)                                                                                  \
  ATTEND_UNIT(KV, 64, QK) ATTEND_UNIT(KV, 80, WIDEN) ATTEND_UNIT(KV, 96, QK)                  \
  ATTEND_UNIT(KV, 128, QK) ATTEND_UNIT(KV, 256, QK) ATTEND_UNIT(KV, 576, QK) ATTEND_ANY(KV)

QK_KEYS_ALL(f32)
QK_KEYS_ALL(bf16)
QK_KEYS_ALL(f16)
ATTEND_UNITS(f32, WIDEN)
#if HAVE_DPBF16  // 80 = 5 x 16 is no whole number of 32-element pairs: it widens
QK_KEYS_DPBF16(64) QK_KEYS_DPBF16(96) QK_KEYS_DPBF16(128) QK_KEYS_DPBF16(256)
QK_KEYS_DPBF16(576)  // MLA's latent: kv_lora_rank 512 + qk_rope_head_dim 64
ATTEND_UNITS(bf16, DPBF16)
#else
ATTEND_UNITS(bf16, WIDEN)
#endif
ATTEND_UNITS(f16, WIDEN)
QK_KEYS_ALL(e4m3)
QK_KEYS_ALL(e5m2)
ATTEND_UNITS(e4m3, WIDEN)
ATTEND_UNITS(e5m2, WIDEN)

#include "paged_attention_heads_cpu.h"
#define ATTEND_HEADS_ALL(KV, QK)                                                        \
  V_ROWS(KV) ATTEND_HEADS(KV, 64, QK) ATTEND_HEADS(KV, 80, WIDEN) ATTEND_HEADS(KV, 96, QK)          \
  ATTEND_HEADS(KV, 128, QK) ATTEND_HEADS(KV, 256, QK)
ATTEND_HEADS_ALL(f32, WIDEN)
#if HAVE_DPBF16
ATTEND_HEADS_ALL(bf16, DPBF16)
#else
ATTEND_HEADS_ALL(bf16, WIDEN)
#endif
ATTEND_HEADS_ALL(f16, WIDEN)
ATTEND_HEADS_ALL(e4m3, WIDEN)
ATTEND_HEADS_ALL(e5m2, WIDEN)

// With -DPAGEDGEN_KV_DTYPE=c (pagedgen.kernels.cpu builds one library per cache dtype), only
// that dtype's functions are referenced, and the compiler drops the others' (the five dtypes
// together took ~50 s to build at -O3); the entry point refuses the rest.
#ifdef PAGEDGEN_KV_DTYPE
#define BUILT(code) (PAGEDGEN_KV_DTYPE == (code))
#else
#define BUILT(code) 1
#endif
// PICK(KV)'s function for kv_dtype (KV_DTYPE_CODES' order), NULL where this build has none.
#define PICK_BY_DTYPE(PICK)                 \
  if (BUILT(0) && kv_dtype == 0) PICK(f32)  \
  if (BUILT(1) && kv_dtype == 1) PICK(bf16) \
  if (BUILT(2) && kv_dtype == 2) PICK(f16)  \
  if (BUILT(3) && kv_dtype == 3) PICK(e4m3) \
  if (BUILT(4) && kv_dtype == 4) PICK(e5m2) \
  return NULL;

typedef void (*AttendUnit)(const Work *, int64_t, int, float *);
typedef void (*AttendHeads)(const Work *, int64_t, int, int, HeadsScratch *);

#define PICK_HEADS(KV)                         \
  switch (head_dim) {                          \
    case 64: return attend_heads_##KV##_64;    \
    case 80: return attend_heads_##KV##_80;    \
    case 96: return attend_heads_##KV##_96;    \
    case 128: return attend_heads_##KV##_128;  \
    case 256: return attend_heads_##KV##_256;  \
    default: return NULL;                      \
  }

// The sequence-major pass where it applies: several kv heads (a stride apart in each row) of
// small groups (MLA's one latent, read whole by the unit pass, stays there); NULL elsewhere.
static AttendHeads attend_heads_for(int kv_dtype, int head_dim, int num_kv_heads, int group) {
  if (num_kv_heads < 2 || group > 8) return NULL;
  PICK_BY_DTYPE(PICK_HEADS)
}

#define PICK_UNIT(KV)                      \
  switch (head_dim) {                      \
    case 64: return attend_##KV##_64;      \
    case 80: return attend_##KV##_80;      \
    case 96: return attend_##KV##_96;      \
    case 128: return attend_##KV##_128;    \
    case 256: return attend_##KV##_256;    \
    case 576: return attend_##KV##_576;    \
    default: return attend_##KV##_any;     \
  }

static AttendUnit attend_unit_for(int kv_dtype, int head_dim) {
  PICK_BY_DTYPE(PICK_UNIT)
}

// The runs of kv heads h0 .. h1 of a sequence, MAX_ROWS query heads at most, that the
// sequence-major pass takes in turn, from unit u on.
static int64_t next_run(const Work *w, int64_t u, int64_t *seq, int *h0, int *h1) {
  const int max_heads = MAX_ROWS / (w->num_heads / w->num_kv_heads);
  *seq = u / w->num_kv_heads;
  *h0 = (int)(u % w->num_kv_heads);
  *h1 = w->num_kv_heads;
  if (*h1 - *h0 > max_heads) *h1 = *h0 + max_heads;
  if (*h1 - *h0 > w->unit_end - u) *h1 = *h0 + (int)(w->unit_end - u);
  return u + *h1 - *h0;
}

// The blocks of the runs in the order the pass reads them (see Stream), or NULL.
static BlockRows *stream_blocks(const Work *w, int elem_size, int64_t *num_blocks) {
  int64_t count = 0, seq;
  int h0, h1;
  for (int64_t u = w->unit_begin; u < w->unit_end;) {
    u = next_run(w, u, &seq, &h0, &h1);
    const Unit unit = unit_of(w, seq, h0);
    count += 2 * (unit.num_blocks - unit.first / w->block_size);
  }
  BlockRows *blocks = (BlockRows *)malloc(sizeof(BlockRows) * (size_t)(count + 1));
  if (blocks == NULL) return NULL;
  *num_blocks = 0;
  for (int64_t u = w->unit_begin; u < w->unit_end;) {
    u = next_run(w, u, &seq, &h0, &h1);
    const Unit unit = unit_of(w, seq, h0);
    for (int pass = 0; pass < 2; pass++) {
      const char *cache = (const char *)(pass == 0 ? w->key_cache : w->value_cache);
      FOR_EACH_BLOCK(w, unit, {
        const int64_t row = (int64_t)unit.block_table[b] * w->block_size + i_begin;
        BlockRows *at = &blocks[(*num_blocks)++];
        const char *rows = cache + (row * unit.row_stride + (int64_t)h0 * w->head_dim) * elem_size;
        const int64_t skew = (int64_t)((uintptr_t)rows & 63);
        const int64_t bytes = (int64_t)(h1 - h0) * w->head_dim * elem_size;
        // Rows a whole number of lines apart start at the same place in a line; others may
        // start anywhere in one.
        const int64_t start = unit.row_stride * elem_size % 64 == 0 ? skew : 63;
        at->rows = rows - skew;
        at->num_rows = n - i_begin;
        at->lines = (int)((start + bytes + 63) / 64);
      })
    }
  }
  return blocks;
}

// Runs of a sequence's kv heads through the sequence-major pass, the first blocks of the stream
// asked for before the first pass reads them.
static int run_heads(const Work *w, AttendHeads attend, int max_context_len, int elem_size) {
  HeadsScratch x;
  x.scores = (float *)malloc(sizeof(float) * MAX_ROWS * (size_t)(max_context_len + 1));
  x.acc = (float *)aligned_alloc(64, sizeof(float) * MAX_ROWS * (size_t)w->head_dim);
  x.qv = aligned_alloc(64, sizeof(float) * MAX_ROWS * (size_t)w->head_dim);
  x.stream.blocks = stream_blocks(w, elem_size, &x.stream.num_blocks);
  x.stream.row_bytes = (int64_t)w->num_kv_heads * w->head_dim * elem_size;
  const int64_t block_bytes = (int64_t)w->block_size * w->head_dim * elem_size *
                              (w->num_kv_heads < MAX_ROWS ? w->num_kv_heads : MAX_ROWS);
  x.stream.lead = PF_LEAD / block_bytes > 1 ? PF_LEAD / block_bytes : 1;
  int status = x.scores == NULL || x.acc == NULL || x.qv == NULL || x.stream.blocks == NULL;
  for (x.stream.at = -x.stream.lead - 1; x.stream.at < 0 && !status;) {
    stream_advance(&x.stream);  // at -lead .. -1: the first blocks asked for whole; then 0
    if (x.stream.at < 0) prefetch_lines(&x.stream, lines_ahead(&x.stream));
  }
  int64_t seq;
  int h0, h1;
  for (int64_t u = w->unit_begin; u < w->unit_end && !status;) {
    u = next_run(w, u, &seq, &h0, &h1);
    attend(w, seq, h0, h1, &x);
  }
  free(x.scores), free(x.acc), free(x.qv), free(x.stream.blocks);
  return status;
}

static int run_units(const Work *w, AttendUnit attend, AttendHeads heads, int elem_size) {
  int max_context_len = 0;
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int n = w->context_lens[u / w->num_kv_heads];
    max_context_len = n > max_context_len ? n : max_context_len;
  }
  if (heads != NULL) return run_heads(w, heads, max_context_len, elem_size);
  const int group = w->num_heads / w->num_kv_heads;
  float *scores = (float *)malloc(sizeof(float) * (size_t)group * (size_t)(max_context_len + 1));
  if (scores == NULL) return 1;
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int64_t seq = u / w->num_kv_heads;
    const int kv_head = (int)(u % w->num_kv_heads);
    attend(w, seq, kv_head, scores);
  }
  free(scores);
  return 0;
}

// 1 where this build can load float16 caches, else 0.
int paged_attention_has_float16(void) {
#ifdef HAVE_FLOAT16
  return 1;
#else
  return 0;
#endif
}

// Returns 0 on success, 1 on a bad argument or a failed allocation.
int paged_attention_decode(int kv_dtype, int act_bf16, void *out, const void *query,
                           int64_t query_seq_stride,
                           const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride,
                           const int32_t *context_lens, int64_t num_seqs, int num_heads,
                           int num_kv_heads, int head_dim, int block_size, float scale,
                           int sliding_window, float softcap, const float *sinks,
                           const float *alibi_slopes, int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP)
    return 1;
  if (kv_dtype < 0 || kv_dtype > 4 || (kv_dtype == 2 && !paged_attention_has_float16())) return 1;
  const AttendUnit attend = attend_unit_for(kv_dtype, head_dim);
  if (attend == NULL) return 1;  // a cache dtype this build leaves out
  const AttendHeads heads =
      attend_heads_for(kv_dtype, head_dim, num_kv_heads, num_heads / num_kv_heads);
  static const int elem_sizes[] = {4, 2, 2, 1, 1};
  const int elem_size = elem_sizes[kv_dtype];
  if (num_threads < 1) num_threads = 1;
  if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
  const int64_t num_units = num_seqs * num_kv_heads;
  if (num_threads > num_units) num_threads = num_units > 0 ? (int)num_units : 1;

  // Contiguous runs of units with about equal total context, the cost of a unit.
  int64_t total = 0;
  for (int64_t s = 0; s < num_seqs; s++) total += (int64_t)context_lens[s] * num_kv_heads;
  Work work[MAX_THREADS];
  int64_t unit = 0, done = 0;
  for (int i = 0; i < num_threads; i++) {
    const int64_t target = total * (i + 1) / num_threads;
    work[i] = (Work){out,        query,        key_cache,  value_cache, block_tables,
                     context_lens, query_seq_stride, block_table_stride, num_heads,
                     num_kv_heads, head_dim,     block_size, scale,       sliding_window,
                     softcap,      sinks,        alibi_slopes, unit,      unit,
                     act_bf16};
    while (unit < num_units && (done < target || i == num_threads - 1)) {
      done += context_lens[unit / num_kv_heads];
      unit++;
    }
    work[i].unit_end = unit;
  }

  int status = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads) reduction(| : status)
  for (int i = omp_get_thread_num(); i < num_threads; i += omp_get_num_threads())
    status |= run_units(&work[i], attend, heads, elem_size);
#else
  for (int i = 0; i < num_threads; i++) status |= run_units(&work[i], attend, heads, elem_size);
#endif
  return status;
}
