// Tiles of a paged K/V cache in shared memory for the tensor-core attention kernels
// (decode_attend_mma.cuh, prefill_attention_mma.cu): a tile is TILE_TOKENS consecutive tokens of
// one kv head, K and V each [TILE_TOKENS][HEAD_SIZE] of 16-bit elements, stored as 16-byte pieces
// of 8 elements whose position in a row is XOR-swizzled by row % 8, so that the 8 rows an
// ldmatrix reads, and the pieces a cp.async wave writes, fall in distinct banks.
#pragma once

#include "common.cuh"
#include "mma.cuh"

namespace pagedgen {

using Piece = Vec<unsigned, 4>;

// The piece index of element piece p (elements 8p ... 8p + 7) of row `row`, rows of ROW pieces.
template <int ROW>
__device__ __forceinline__ int swizzled_piece(int row, int p) {
  static_assert(ROW % 8 == 0, "the swizzle permutes 8 pieces at a time");
  return row * ROW + (p ^ (row & 7));
}

// Copies tiles into shared memory with cp.async, THREADS threads together: thread tid copies
// piece tid % ROW of rows tid / ROW + k * ROWS_PER_PASS. A tile starts on a KV block boundary;
// its physical blocks reach a thread by shuffle from lanes 0 ... TILE_BLOCKS - 1 of its warp,
// which read them from the block table with `blocks`, for the caller to do a tile ahead.
template <typename T, int HEAD_SIZE, int BLOCK_SIZE, int TILE_TOKENS, int THREADS>
struct KvTileLoader {
  static constexpr int kRow = HEAD_SIZE / 8;
  static constexpr int kRowsPerPass = THREADS / kRow;
  static constexpr int kTileBlocks = TILE_TOKENS / BLOCK_SIZE;
  static_assert(THREADS % kRow == 0 && TILE_TOKENS % kRowsPerPass == 0, "whole rows a pass");
  static_assert(TILE_TOKENS % BLOCK_SIZE == 0 && kTileBlocks <= kWarpSize, "whole blocks");

  const T* k_head;  // this thread's piece of token 0 of block 0
  const T* v_head;
  const int* block_table;
  int token_stride;
  int first_row;
  int piece;
  int lane;

  __device__ KvTileLoader(const T* key_cache, const T* value_cache, const int* block_table_,
                          int kv_head, int num_kv_heads)
      : block_table(block_table_), token_stride(num_kv_heads * HEAD_SIZE),
        first_row(threadIdx.x / kRow), piece(threadIdx.x % kRow), lane(threadIdx.x % kWarpSize) {
    k_head = key_cache + kv_head * HEAD_SIZE + piece * 8;
    v_head = value_cache + kv_head * HEAD_SIZE + piece * 8;
  }

  // Lane j's physical block of the tile that starts at first_token (j < kTileBlocks, and the
  // block holds a token before end_token), else 0.
  __device__ int blocks(int first_token, int end_token) const {
    const int b = first_token / BLOCK_SIZE + lane;
    return lane < kTileBlocks && b * BLOCK_SIZE < end_token ? block_table[b] : 0;
  }

  // Copies the tile at first_token, its `blocks`, into rows stage_row ... of s_k and s_v;
  // tokens outside [begin, end) become zeros, read from nowhere. Every lane of the warp calls it.
  __device__ void load(Piece* s_k, Piece* s_v, int stage_row, int first_token, int begin,
                       int end, int blocks) const {
#pragma unroll
    for (int k = 0; k < TILE_TOKENS / kRowsPerPass; ++k) {
      const int row = first_row + k * kRowsPerPass;
      const int token = first_token + row;
      const int physical = __shfl_sync(kFullMask, blocks, row / BLOCK_SIZE);
      const bool valid = token >= begin && token < end;
      const long long offset = (long long)(physical * BLOCK_SIZE + row % BLOCK_SIZE) * token_stride;
      const int slot = swizzled_piece<kRow>(stage_row + row, piece);
      cp_async_16(&s_k[slot], k_head + offset, valid);
      cp_async_16(&s_v[slot], v_head + offset, valid);
    }
  }
};

}  // namespace pagedgen
