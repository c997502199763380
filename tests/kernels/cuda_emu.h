// Just enough CUDA for g++ to run the kernels in kernels/ on the CPU.
//
// Each thread of a block is a fiber (ucontext) with a stack of its own, and exactly one runs at a
// time: a thread keeps the turn until it reaches a sync point (__syncthreads, __syncwarp, a
// shuffle) or returns, then hands it to the next runnable thread in tid order. The schedule is
// therefore deterministic, and a missing barrier shows as stale data rather than as a rare race.
// Blocks run one after another, which makes a function-local static the block's __shared__
// memory. A barrier that can never complete (a __syncthreads in divergent code, a shuffle with
// lanes gone) fails the launch.
#pragma once

#include <math.h>

#include <sys/mman.h>
#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};
inline dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};

inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, 2);
  return static_cast<float>(f);
}
inline __half __float2half_rn(float x) {
  const _Float16 f = static_cast<_Float16>(x);
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}
inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return {uint16_t(u >> 16)};
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline float __expf(float x) { return expf(x); }
// Blocks run one after another, each thread alone: atomics are plain read-modify-writes and
// every write is visible to the next reader.
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
inline void __threadfence() {}
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
// g++ at -O1 for x86-64 contracts nothing into an FMA, so plain operators round each step.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// L2 prefetches (kernels/kv_prefetch.cuh) change nothing on a CPU: their addresses are recorded
// for the tests, which read them with emu_prefetched and empty the record with emu_clear_prefetched.
static std::vector<uintptr_t> emu_prefetches;  // one per library (an inline one is shared)
inline void emu_prefetch_l2(const void* p) {
  emu_prefetches.push_back(reinterpret_cast<uintptr_t>(p));
}
extern "C" size_t emu_num_prefetched() { return emu_prefetches.size(); }
extern "C" uintptr_t emu_prefetched(size_t i) { return emu_prefetches[i]; }
extern "C" void emu_clear_prefetched() { emu_prefetches.clear(); }

// The two schedules, each an end of what a GPU may do. By default a thread that reaches a sync
// point hands the turn to the next thread in tid order, so warps move in step, and a cp.async
// copy lands at the wait that retires its group (the latest it may): a read before its wait or
// barrier sees stale data. Racing (emu_set_racing(1)), the lowest runnable thread always runs, so
// warp 0 runs ahead of the others as far as the barriers let it, and a copy lands at issue (the
// earliest): a copy or write over shared memory that a later warp has yet to read shows.
static bool emu_racing = false;
extern "C" void emu_set_racing(int racing) { emu_racing = racing; }

namespace emu {

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kExited };

// The threads of a block, as fibers on the launching thread: a thread runs until it arrives at a
// sync point, then switches to the next runnable one in tid order. A launch ends, or is
// abandoned with its fibers, by switching back to the launching thread.
class Scheduler {
 public:
  static constexpr size_t kStackBytes = 512 * 1024;  // kernels keep their locals here
  static constexpr size_t kGuardBytes = 4096;  // the lowest page of each stack: overflow faults

  static constexpr size_t kSlotWords = 8;  // a lane's share of a warp exchange: 64 bytes

  Scheduler(int num_threads, unsigned num_blocks, size_t shared_bytes,
            std::function<void()> run_block)
      : num_threads_(num_threads), num_blocks_(num_blocks), run_block_(std::move(run_block)),
        states_(num_threads, State::kRunnable), fibers_(num_threads),
        exchange_((num_threads / 32) * 2 * 32 * kSlotWords), parity_(num_threads),
        copies_(num_threads), dynamic_shared_(shared_bytes) {
    stacks_ = mmap(nullptr, kStackBytes * num_threads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (stacks_ == MAP_FAILED) {
      stacks_ = nullptr;
      error_ = "cannot map the threads' stacks";
      return;
    }
    for (int tid = 0; tid < num_threads; ++tid) {
      char* stack = static_cast<char*>(stacks_) + kStackBytes * tid;
      mprotect(stack, kGuardBytes, PROT_NONE);
      getcontext(&fibers_[tid]);
      fibers_[tid].uc_stack.ss_sp = stack + kGuardBytes;
      fibers_[tid].uc_stack.ss_size = kStackBytes - kGuardBytes;
      fibers_[tid].uc_link = &launcher_;
      makecontext(&fibers_[tid], reinterpret_cast<void (*)()>(&Scheduler::fiber_main), 1, tid);
    }
  }
  ~Scheduler() {
    if (stacks_ != nullptr) munmap(stacks_, kStackBytes * num_threads_);
  }

  // Runs every block; returns an empty string, or what went wrong.
  std::string run() {
    if (stacks_ == nullptr) return error_;
    active_ = this;
    set_block(0);
    threadIdx = dim3(0);
    swapcontext(&launcher_, &fibers_[0]);
    active_ = nullptr;
    return error_;
  }

  void arrive(int self, State state) {
    states_[self] = state;
    release_complete_barriers();
    if (emu_racing) {
      run_lowest(self);
    } else if (states_[self] != State::kRunnable) {
      pass_turn(self);
    }
  }

  // Every lane's value, all[lane], once every lane of the warp has given its own: the warp-wide
  // exchange under shuffles, ldmatrix and mma.
  template <typename T>
  void gather(const T& value, T (&all)[32]) {
    static_assert(sizeof(T) <= kSlotWords * 8, "a lane exchanges at most 64 bytes");
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // Two buffers per warp: a lane can only reuse one after every lane has read it.
    uint64_t* buffer = &exchange_[(warp * 2 + parity_[tid]) * 32 * kSlotWords];
    parity_[tid] ^= 1;
    std::memcpy(&buffer[lane * kSlotWords], &value, sizeof(T));
    arrive(tid, State::kAtWarpBarrier);
    for (int i = 0; i < 32; ++i) std::memcpy(&all[i], &buffer[i * kSlotWords], sizeof(T));
  }

  template <typename T>
  T shuffle_xor(T value, int lane_mask) {
    T all[32];
    gather(value, all);
    return all[(threadIdx.x % 32) ^ lane_mask];
  }

  // cp.async: a copy joins the thread's open group; a commit closes it; a wait with n groups
  // allowed in flight lands the oldest groups' copies until n remain.
  struct AsyncCopy {
    void* dst;
    const void* src;
    size_t bytes, src_bytes;  // past src_bytes the destination gets zeros
  };
  struct ThreadCopies {
    std::vector<AsyncCopy> open;
    std::vector<std::vector<AsyncCopy>> committed;  // oldest first
  };
  ThreadCopies& copies() { return copies_[threadIdx.x]; }

  void* dynamic_shared() { return dynamic_shared_.data(); }
  size_t dynamic_shared_bytes() const { return dynamic_shared_.size(); }

  [[noreturn]] void fail(const std::string& message) {
    if (error_.empty()) error_ = message;
    setcontext(&launcher_);  // the launch is abandoned: no fiber runs again
    __builtin_unreachable();
  }

  static Scheduler* active() { return active_; }

 private:
  static void fiber_main(int tid) {
    Scheduler& self = *active_;
    for (;;) {
      self.run_block_();
      self.finish_block(tid);
    }
  }

  // A block starts with no copies in flight and its dynamic shared memory all ones (NaN as
  // float16, bfloat16 and float32), as unwritten shared memory holds whatever it held.
  void set_block(unsigned b) {
    block_ = b;
    for (ThreadCopies& c : copies_) c = ThreadCopies();
    std::memset(dynamic_shared_.data(), 0xff, dynamic_shared_.size());
    blockIdx = dim3(b % gridDim.x, b / gridDim.x % gridDim.y, b / (gridDim.x * gridDim.y));
  }

  // The thread returned from the kernel: the last one out of a block starts the next block at
  // thread 0 (every thread then runs the kernel again), or ends the launch.
  void finish_block(int self) {
    states_[self] = State::kExited;
    release_complete_barriers();
    bool all_exited = true;
    for (State s : states_) all_exited = all_exited && s == State::kExited;
    if (!all_exited) {
      emu_racing ? run_lowest(self) : pass_turn(self);
      return;
    }
    if (block_ + 1 == num_blocks_) setcontext(&launcher_);
    for (State& s : states_) s = State::kRunnable;
    set_block(block_ + 1);
    if (self != 0) switch_to(self, 0);
  }

  void release_complete_barriers() {
    bool block_complete = true, anyone_left = false;
    for (State s : states_) {
      if (s == State::kExited) continue;
      anyone_left = true;
      block_complete = block_complete && s == State::kAtBlockBarrier;
    }
    if (anyone_left && block_complete) {
      for (State& s : states_) {
        if (s == State::kAtBlockBarrier) s = State::kRunnable;
      }
    }
    for (int first = 0; first < num_threads_; first += 32) {
      int waiting = 0, exited = 0;
      for (int i = first; i < first + 32; ++i) {
        waiting += states_[i] == State::kAtWarpBarrier;
        exited += states_[i] == State::kExited;
      }
      if (waiting == 0 || waiting + exited < 32) continue;
      if (exited > 0) {
        fail("warp " + std::to_string(first / 32) + " synchronises with exited lanes");
      }
      for (int i = first; i < first + 32; ++i) states_[i] = State::kRunnable;
    }
  }

  void pass_turn(int self) {
    for (int step = 1; step <= num_threads_; ++step) {
      const int next = (self + step) % num_threads_;
      if (states_[next] == State::kRunnable) {
        switch_to(self, next);
        return;
      }
    }
    fail("deadlock: a barrier that not every thread reaches");
  }

  void run_lowest(int self) {
    for (int next = 0; next < num_threads_; ++next) {
      if (states_[next] == State::kRunnable) {
        if (next != self) switch_to(self, next);
        return;
      }
    }
    fail("deadlock: a barrier that not every thread reaches");
  }

  // Whoever switches to a fiber sets threadIdx for it: a fiber resumes only through here.
  void switch_to(int self, int next) {
    threadIdx = dim3(next);
    swapcontext(&fibers_[self], &fibers_[next]);
  }

  static inline Scheduler* active_ = nullptr;
  const int num_threads_;
  const unsigned num_blocks_;
  const std::function<void()> run_block_;
  std::vector<State> states_;
  std::vector<ucontext_t> fibers_;
  ucontext_t launcher_;
  void* stacks_ = nullptr;
  std::vector<uint64_t> exchange_;
  std::vector<int> parity_;
  std::vector<ThreadCopies> copies_;
  std::vector<unsigned char> dynamic_shared_;
  unsigned block_ = 0;
  std::string error_;
};

template <typename... Params, size_t... I>
void call(void (*kernel)(Params...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<Params>>*>(args[I])...);
}

// Runs kernel<<<grid, block>>>(args...) with args given as cudaLaunchKernel takes them: one
// pointer per parameter. Returns an empty string on success, else what went wrong.
template <typename... Params>
std::string launch(void (*kernel)(Params...), dim3 grid, dim3 block, void** args,
                   size_t shared_bytes = 0) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x % 32 != 0 || block.x > 1024) {
    return "the emulator runs 1-D blocks of whole warps, up to 1024 threads";
  }
  const unsigned num_blocks = grid.x * grid.y * grid.z;
  if (num_blocks == 0) return "";
  gridDim = grid;
  blockDim = block;
  Scheduler scheduler(block.x, num_blocks, shared_bytes,
                      [&] { call(kernel, args, std::index_sequence_for<Params...>{}); });
  return scheduler.run();
}

}  // namespace emu

inline void __syncthreads() {
  emu::Scheduler::active()->arrive(threadIdx.x, emu::State::kAtBlockBarrier);
}

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::Scheduler::active()->fail("__syncwarp with a partial mask");
  emu::Scheduler::active()->arrive(threadIdx.x, emu::State::kAtWarpBarrier);
}

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
  if (mask != 0xffffffffu || width != 32) {
    emu::Scheduler::active()->fail("shuffle with a partial mask");
  }
  T all[32];
  emu::Scheduler::active()->gather(value, all);
  return all[src_lane % 32];
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  if (mask != 0xffffffffu || width != 32) {
    emu::Scheduler::active()->fail("shuffle with a partial mask");
  }
  return emu::Scheduler::active()->shuffle_xor(value, lane_mask);
}

#include "cuda_emu_sm80.h"  // the sm_80 primitives of kernels/mma.cuh
