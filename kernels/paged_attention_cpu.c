// Paged decode attention for the CPU: one query row per sequence, K/V read through the block
// table in place, one pass over each (sequence, kv head) for all the query heads that share it
// (GQA). Two passes over the context: scores (q . k) for every token, then softmax, then the
// weighted sum of V rows.
//
// Cache layout, shared with the CUDA kernels and the torch backend:
//
//   key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]   (contiguous)
//   token t of sequence s lives in block block_tables[s][t / block_size], row t % block_size
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

#define MAX_THREADS 256
#define MAX_GROUP 64  // query heads per kv head

// exp(x) for x <= 0 (scores minus their max) as 2^n * p(r), r = x - n ln 2, |r| <= ln 2 / 2:
// Cephes' expf polynomial, within 2 ulp of expf, and free of calls so the softmax loop vectorizes.
static inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // exp(-87) ~ 1.6e-38 stays a normal float; softmax sees ~0
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

typedef struct {
  float *out;          // [num_seqs, num_heads, head_dim], contiguous
  const float *query;  // [num_seqs, num_heads, head_dim], rows query_seq_stride apart
  const float *key_cache;
  const float *value_cache;
  const int32_t *block_tables;  // [num_seqs, block_table_stride]
  const int32_t *context_lens;  // [num_seqs]
  int64_t query_seq_stride;
  int64_t block_table_stride;
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int64_t unit_begin, unit_end;  // units: seq * num_kv_heads + kv_head
} Work;

// 16 floats, lowered by GCC/Clang to whatever vector registers the target has.
typedef float vf16 __attribute__((vector_size(64)));

static inline vf16 load_vf16(const float *p) {
  vf16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline float hsum_vf16(vf16 v) {
  float s = 0.0f;
  for (int i = 0; i < 16; i++) s += v[i];
  return s;
}

typedef float f1;
static inline float load_f1(const float *p) { return *p; }
static inline float hsum_f1(float v) { return v; }

// One (sequence, kv head) unit with head_dim = NV * WIDTH, in vectors of WIDTH floats. With NV a
// constant, q and the output accumulators stay in registers while a block's K or V rows for this
// head (a few KiB) are re-read from L1 for each query head of the group.
#define ATTEND_UNIT(NAME, VEC, WIDTH, NV)                                                      \
  static void NAME(const Work *w, int64_t seq, int kv_head, float *scores) {                   \
    const int nv = (NV), head_dim = nv * (WIDTH);                                             \
    const int group = w->num_heads / w->num_kv_heads;                                         \
    const int context_len = w->context_lens[seq];                                             \
    const int block_size = w->block_size;                                                     \
    const int num_blocks = (context_len + block_size - 1) / block_size;                       \
    const float scale = w->scale;                                                             \
    const int64_t row_stride = (int64_t)w->num_kv_heads * head_dim;                           \
    const int64_t head_offset = (int64_t)kv_head * head_dim;                                  \
    const int32_t *block_table = w->block_tables + seq * w->block_table_stride;               \
    const float *q = w->query + seq * w->query_seq_stride + (int64_t)kv_head * group * head_dim; \
    float *out = w->out + (seq * w->num_heads + (int64_t)kv_head * group) * head_dim;         \
    for (int b = 0; b < num_blocks; b++) {                                                    \
      const float *k_block =                                                                  \
          w->key_cache + (int64_t)block_table[b] * block_size * row_stride + head_offset;     \
      const int t0 = b * block_size;                                                          \
      const int n = context_len - t0 < block_size ? context_len - t0 : block_size;            \
      for (int g = 0; g < group; g++) {                                                       \
        VEC qv[NV];                                                                           \
        for (int j = 0; j < nv; j++) qv[j] = load_##VEC(q + g * head_dim + j * (WIDTH));      \
        float *s = scores + g * context_len + t0;                                             \
        for (int i = 0; i < n; i++) {                                                         \
          const float *k = k_block + i * row_stride;                                          \
          VEC acc = qv[0] * load_##VEC(k);                                                    \
          for (int j = 1; j < nv; j++) acc += qv[j] * load_##VEC(k + j * (WIDTH));            \
          s[i] = hsum_##VEC(acc) * scale;                                                     \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    float inv_sum[MAX_GROUP];                                                                 \
    for (int g = 0; g < group; g++) {                                                         \
      float *s = scores + g * context_len;                                                    \
      float max = -INFINITY;                                                                  \
      for (int t = 0; t < context_len; t++) max = s[t] > max ? s[t] : max;                    \
      float sum = 0.0f;                                                                       \
      for (int t = 0; t < context_len; t++) {                                                 \
        s[t] = exp_nonpositive(s[t] - max);                                                   \
        sum += s[t];                                                                          \
      }                                                                                       \
      inv_sum[g] = 1.0f / sum;                                                                \
    }                                                                                         \
    for (int g = 0; g < group; g++) {                                                         \
      VEC acc[NV];                                                                            \
      for (int j = 0; j < nv; j++) acc[j] = (VEC){0};                                         \
      const float *p = scores + g * context_len;                                              \
      for (int b = 0; b < num_blocks; b++) {                                                  \
        const float *v_block =                                                                \
            w->value_cache + (int64_t)block_table[b] * block_size * row_stride + head_offset; \
        const int t0 = b * block_size;                                                        \
        const int n = context_len - t0 < block_size ? context_len - t0 : block_size;          \
        for (int i = 0; i < n; i++) {                                                         \
          const float *v = v_block + i * row_stride;                                          \
          for (int j = 0; j < nv; j++) acc[j] += p[t0 + i] * load_##VEC(v + j * (WIDTH));     \
        }                                                                                     \
      }                                                                                       \
      for (int j = 0; j < nv; j++) {                                                          \
        const VEC o = acc[j] * inv_sum[g];                                                    \
        memcpy(out + g * head_dim + j * (WIDTH), &o, sizeof o);                               \
      }                                                                                       \
    }                                                                                         \
  }

ATTEND_UNIT(attend_unit_64, vf16, 16, 4)
ATTEND_UNIT(attend_unit_80, vf16, 16, 5)
ATTEND_UNIT(attend_unit_96, vf16, 16, 6)
ATTEND_UNIT(attend_unit_128, vf16, 16, 8)
ATTEND_UNIT(attend_unit_256, vf16, 16, 16)
ATTEND_UNIT(attend_unit_any, f1, 1, w->head_dim)  // q and accumulators as arrays of floats

typedef void (*AttendUnit)(const Work *, int64_t, int, float *);

static AttendUnit attend_unit_for(int head_dim) {
  switch (head_dim) {
    case 64: return attend_unit_64;
    case 80: return attend_unit_80;
    case 96: return attend_unit_96;
    case 128: return attend_unit_128;
    case 256: return attend_unit_256;
    default: return attend_unit_any;
  }
}

static int run_units(const Work *w) {
  int max_context_len = 0;
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int n = w->context_lens[u / w->num_kv_heads];
    max_context_len = n > max_context_len ? n : max_context_len;
  }
  const int group = w->num_heads / w->num_kv_heads;
  float *scores = (float *)malloc(sizeof(float) * (size_t)group * (size_t)(max_context_len + 1));
  if (scores == NULL) return 1;
  const AttendUnit attend = attend_unit_for(w->head_dim);
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int64_t seq = u / w->num_kv_heads;
    const int kv_head = (int)(u % w->num_kv_heads);
    attend(w, seq, kv_head, scores);
  }
  free(scores);
  return 0;
}

// Returns 0 on success, 1 on a bad argument or a failed allocation.
int paged_attention_decode_f32(float *out, const float *query, int64_t query_seq_stride,
                               const float *key_cache, const float *value_cache,
                               const int32_t *block_tables, int64_t block_table_stride,
                               const int32_t *context_lens, int64_t num_seqs, int num_heads,
                               int num_kv_heads, int head_dim, int block_size, float scale,
                               int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP)
    return 1;
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
                     num_kv_heads, head_dim,     block_size, scale,       unit, unit};
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
    status |= run_units(&work[i]);
#else
  for (int i = 0; i < num_threads; i++) status |= run_units(&work[i]);
#endif
  return status;
}
