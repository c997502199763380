// L2 prefetch for the decode kernels: while a warp attends one KV block, it asks L2 for the K
// and V rows of the next block it will read, so that those loads find their lines in L2 and the
// GPU keeps more bytes in flight than the warp's own loads do. A hint only: results never change.
// -DPAGEDGEN_L2_PREFETCH=1 turns it on: paged_attention_launches(l2_prefetch=True), which the
// cupy backend passes under PAGEDGEN_CUDA_DECODE_PREFETCH=1.
#pragma once

#include "common.cuh"

#ifndef PAGEDGEN_L2_PREFETCH
#define PAGEDGEN_L2_PREFETCH 0
#endif

namespace pagedgen {

constexpr int kCacheLine = 128;

__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDACC__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  emu_prefetch_l2(p);  // the emulator records the address
#endif
}

// Every 128-byte line of one kv head's K and V rows in one KV block (block_offset as the decode
// kernels compute it: physical block * BLOCK_SIZE * token_stride + kv_head * HEAD_SIZE), split
// over the warp's lanes. A row of R bytes is touched at its start + 128 * i, and where R is not
// a whole number of lines at its last byte too, which reaches every line it spans wherever it
// starts. Rows of whole lines are taken to start on one: the pool's base is (torch's CUDA
// allocator aligns to 512 bytes), and so is every row.
template <typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE>
__device__ __forceinline__ void prefetch_kv_block(const CACHE_T* key_cache,
                                                  const CACHE_T* value_cache,
                                                  long long block_offset, int token_stride,
                                                  int lane) {
  constexpr int kRowBytes = HEAD_SIZE * sizeof(CACHE_T);
  constexpr int kPoints = (kRowBytes + kCacheLine - 1) / kCacheLine + (kRowBytes % kCacheLine != 0);
  constexpr int kRowPoints = BLOCK_SIZE * kPoints;
#pragma unroll 1  // a few iterations a lane; unrolled, their addresses cost the kernel registers
  for (int i = lane; i < 2 * kRowPoints; i += kWarpSize) {
    const int point = i % kPoints;
    const int token = i / kPoints % BLOCK_SIZE;
    const CACHE_T* cache = i < kRowPoints ? key_cache : value_cache;
    const char* row =
        reinterpret_cast<const char*>(cache + block_offset + (long long)token * token_stride);
    prefetch_l2(row + min(point * kCacheLine, kRowBytes - 1));
  }
}

// Where L2 prefetch is on: the lines of block next_block of the sequence's block_table, if it
// is before end_block (a warp's next block: its current one + NUM_WARPS).
template <typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE>
__device__ __forceinline__ void prefetch_next_kv_block(const CACHE_T* key_cache,
                                                       const CACHE_T* value_cache,
                                                       const int* block_table, int next_block,
                                                       int end_block, int kv_head,
                                                       int token_stride, int lane) {
  if (PAGEDGEN_L2_PREFETCH && next_block < end_block) {
    const long long block_offset =
        kv_head * HEAD_SIZE + (long long)block_table[next_block] * BLOCK_SIZE * token_stride;
    prefetch_kv_block<CACHE_T, HEAD_SIZE, BLOCK_SIZE>(key_cache, value_cache, block_offset,
                                                      token_stride, lane);
  }
}

}  // namespace pagedgen
