// The rows and keys of one prefill thread block, shared by prefill_attention.cu and
// prefill_attention_mma.cu: grid (num_kv_heads, row tiles of ROWS, num_seqs). Sequence s owns
// query rows cu_seqlens_q[s] ... cu_seqlens_q[s + 1], the last query_len of its context_len
// tokens; a GQA group is packed into the rows: row m of the sequence is token m / group, query
// head kv_head * group + m % group.
#pragma once

#include "common.cuh"

namespace pagedgen {

struct PrefillTile {
  int kv_head, num_heads, first_row, tile_row;
  int num_rows;   // of the tile's ROWS that hold a query; <= 0: the block has nothing to do
  int first_pos;  // of the sequence's first query token
  int kv_begin, kv_end;  // keys [kv_begin, kv_end) cover every row; no other position is read
  const int* block_table;
};

template <int ROWS>
__device__ __forceinline__ PrefillTile prefill_tile(const int* cu_seqlens_q,
                                                    const int* context_lens,
                                                    const int* block_tables,
                                                    int max_num_blocks_per_seq, int group,
                                                    int window) {
  PrefillTile t;
  const int seq = blockIdx.z;
  t.kv_head = blockIdx.x;
  t.num_heads = gridDim.x * group;
  t.first_row = cu_seqlens_q[seq];
  const int query_len = cu_seqlens_q[seq + 1] - t.first_row;
  t.tile_row = blockIdx.y * ROWS;
  t.num_rows = min(ROWS, query_len * group - t.tile_row);
  t.first_pos = context_lens[seq] - query_len;
  t.kv_end = t.first_pos + (t.tile_row + t.num_rows - 1) / group + 1;
  t.kv_begin = window > 0 ? max(0, t.first_pos + t.tile_row / group - window + 1) : 0;
  t.block_table = block_tables + (long long)seq * max_num_blocks_per_seq;
  return t;
}

}  // namespace pagedgen
