// The emulator's (cuda_emu.h) dynamic shared memory and sm_80 primitives: what
// kernels/common.cuh's PAGEDGEN_DYNAMIC_SHARED and kernels/mma.cuh call under g++, with PTX's
// semantics and alignment rules, on the scheduler's warp exchange.
#pragma once

// Dynamic shared memory (kernels/common.cuh's PAGEDGEN_DYNAMIC_SHARED): the launch's
// shared_bytes, one buffer a block, of which the kernel uses `bytes`.
inline unsigned char* emu_dynamic_shared(size_t bytes) {
  emu::Scheduler& scheduler = *emu::Scheduler::active();
  if (scheduler.dynamic_shared_bytes() < bytes) {
    scheduler.fail("the kernel uses " + std::to_string(bytes) + " bytes of dynamic shared memory, " +
                   "the launch gave " + std::to_string(scheduler.dynamic_shared_bytes()));
  }
  return static_cast<unsigned char*>(scheduler.dynamic_shared());
}

// The sm_80 primitives of kernels/mma.cuh, with PTX's semantics and alignment rules.
inline void emu_require_aligned(const void* p, size_t alignment, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    emu::Scheduler::active()->fail(std::string(what) + " at a misaligned address");
  }
}

inline void emu_land(const emu::Scheduler::AsyncCopy& c) {
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
}

inline void emu_cp_async(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  emu_require_aligned(dst, bytes, "cp.async destination");
  emu_require_aligned(src, bytes, "cp.async source");
  const emu::Scheduler::AsyncCopy copy{dst, src, bytes, src_bytes};
  if (emu_racing) {
    emu_land(copy);
  } else {
    emu::Scheduler::active()->copies().open.push_back(copy);
  }
}

inline void emu_cp_async_commit() {
  auto& copies = emu::Scheduler::active()->copies();
  copies.committed.push_back(std::move(copies.open));
  copies.open.clear();
}

inline void emu_cp_async_wait(int allowed_in_flight) {
  auto& copies = emu::Scheduler::active()->copies();
  while (copies.committed.size() > static_cast<size_t>(allowed_in_flight)) {
    for (const auto& c : copies.committed.front()) emu_land(c);
    copies.committed.erase(copies.committed.begin());
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j ... 8j + 7 address the rows of
// matrix j; r[j] gets its (row lane / 4, columns 2 (lane % 4) + {0, 1}), transposed with trans.
inline void emu_ldmatrix_x4(unsigned (&r)[4], const void* row, bool trans) {
  emu_require_aligned(row, 16, "ldmatrix row");
  const void* rows[32];
  emu::Scheduler::active()->gather(row, rows);
  const int lane = threadIdx.x % 32;
  for (int j = 0; j < 4; ++j) {
    uint16_t e[2];
    for (int i = 0; i < 2; ++i) {
      const int r_ = trans ? 2 * (lane % 4) + i : lane / 4;
      const int c_ = trans ? lane / 4 : 2 * (lane % 4) + i;
      std::memcpy(&e[i], static_cast<const char*>(rows[8 * j + r_]) + 2 * c_, 2);
    }
    r[j] = e[0] | unsigned(e[1]) << 16;
  }
}

template <typename T>
inline float emu_b16_to_float(uint16_t bits) {
  T x;
  std::memcpy(&x, &bits, 2);
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 with D = C = d: the warp's
// fragments assemble A and B, and the lane computes its own four elements of D.
template <typename T>
inline void emu_mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  struct Fragments {
    unsigned a[4], b[2];
  };
  Fragments all[32];
  emu::Scheduler::active()->gather(Fragments{{a[0], a[1], a[2], a[3]}, {b0, b1}}, all);
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane / 4, quad = lane % 4;
    for (int reg = 0; reg < 4; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const uint16_t bits = all[lane].a[reg] >> (16 * half);
        A[group + 8 * (reg % 2)][2 * quad + half + 8 * (reg / 2)] = emu_b16_to_float<T>(bits);
      }
    }
    for (int reg = 0; reg < 2; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const uint16_t bits = all[lane].b[reg] >> (16 * half);
        B[2 * quad + half + 8 * reg][group] = emu_b16_to_float<T>(bits);
      }
    }
  }
  const int lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = group + 8 * (i / 2), col = 2 * quad + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
    d[i] = sum;
  }
}
