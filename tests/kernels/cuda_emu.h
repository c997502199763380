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

namespace emu {

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kExited };

// The threads of a block, as fibers on the launching thread: a thread runs until it arrives at a
// sync point, then switches to the next runnable one in tid order. A launch ends, or is
// abandoned with its fibers, by switching back to the launching thread.
class Scheduler {
 public:
  static constexpr size_t kStackBytes = 512 * 1024;  // kernels keep their locals here
  static constexpr size_t kGuardBytes = 4096;  // the lowest page of each stack: overflow faults

  Scheduler(int num_threads, unsigned num_blocks, std::function<void()> run_block)
      : num_threads_(num_threads), num_blocks_(num_blocks), run_block_(std::move(run_block)),
        states_(num_threads, State::kRunnable), fibers_(num_threads),
        exchange_((num_threads / 32) * 2 * 32), parity_(num_threads) {
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
    if (states_[self] != State::kRunnable) pass_turn(self);
  }

  template <typename T>
  T shuffle_xor(T value, int lane_mask) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // Two buffers per warp: a lane can only reuse one after every lane has read it.
    uint64_t* buffer = &exchange_[(warp * 2 + parity_[tid]) * 32];
    parity_[tid] ^= 1;
    std::memcpy(&buffer[lane], &value, sizeof(T));
    arrive(tid, State::kAtWarpBarrier);
    T out;
    std::memcpy(&out, &buffer[lane ^ lane_mask], sizeof(T));
    return out;
  }

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

  void set_block(unsigned b) {
    block_ = b;
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
      pass_turn(self);
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
std::string launch(void (*kernel)(Params...), dim3 grid, dim3 block, void** args) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x % 32 != 0 || block.x > 1024) {
    return "the emulator runs 1-D blocks of whole warps, up to 1024 threads";
  }
  const unsigned num_blocks = grid.x * grid.y * grid.z;
  if (num_blocks == 0) return "";
  gridDim = grid;
  blockDim = block;
  Scheduler scheduler(block.x, num_blocks,
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
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  if (mask != 0xffffffffu || width != 32) {
    emu::Scheduler::active()->fail("shuffle with a partial mask");
  }
  return emu::Scheduler::active()->shuffle_xor(value, lane_mask);
}
