// Just enough CUDA for g++ to run the kernels in kernels/ on the CPU.
//
// Each thread of a block is a real std::thread, but exactly one runs at a time: a thread keeps
// the turn until it reaches a sync point (__syncthreads, __syncwarp, a shuffle) or returns, then
// hands it to the next runnable thread in tid order. The schedule is therefore deterministic, and
// a missing barrier shows as stale data rather than as a rare race. Blocks run one after another,
// which makes a function-local static the block's __shared__ memory. A barrier that can never
// complete (a __syncthreads in divergent code, a shuffle with lanes gone) fails the launch.
#pragma once

#include <math.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
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
inline thread_local dim3 threadIdx, blockIdx;
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
inline float __expf(float x) { return expf(x); }
// g++ at -O1 for x86-64 contracts nothing into an FMA, so plain operators round each step.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {

struct Aborted {};

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kExited };

class Scheduler {
 public:
  explicit Scheduler(int num_threads)
      : num_threads_(num_threads), states_(num_threads, State::kRunnable), wake_(num_threads),
        exchange_((num_threads / 32) * 2 * 32), parity_(num_threads) {}

  void wait_first_turn(int self) {
    std::unique_lock<std::mutex> lock(mu_);
    wait_turn(self, lock);
  }

  void arrive(int self, State state) {
    std::unique_lock<std::mutex> lock(mu_);
    states_[self] = state;
    release_complete_barriers();
    if (states_[self] != State::kRunnable) pass_turn(self, lock);
  }

  // Returns false once the grid is done.
  bool finish_block(int self, bool last_block) {
    std::unique_lock<std::mutex> lock(mu_);
    states_[self] = State::kExited;
    release_complete_barriers();
    bool all_exited = true;
    for (State s : states_) all_exited = all_exited && s == State::kExited;
    if (!all_exited) {
      pass_turn(self, lock);
      return !done_;
    }
    if (last_block) {
      done_ = true;
      for (auto& cv : wake_) cv.notify_one();
      return false;
    }
    for (State& s : states_) s = State::kRunnable;
    current_ = 0;
    if (self != 0) {
      wake_[0].notify_one();
      wait_turn(self, lock);
    }
    return true;
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

  void fail(const std::string& message) {
    std::unique_lock<std::mutex> lock(mu_);
    abort(message);
    throw Aborted{};
  }

  const std::string& error() const { return error_; }

 private:
  void abort(const std::string& message) {
    if (error_.empty()) error_ = message;
    aborted_ = true;
    for (auto& cv : wake_) cv.notify_one();
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
        abort("warp " + std::to_string(first / 32) + " synchronises with exited lanes");
        return;
      }
      for (int i = first; i < first + 32; ++i) states_[i] = State::kRunnable;
    }
  }

  void pass_turn(int self, std::unique_lock<std::mutex>& lock) {
    int next = -1;
    for (int step = 1; step <= num_threads_ && next < 0; ++step) {
      const int i = (self + step) % num_threads_;
      if (states_[i] == State::kRunnable) next = i;
    }
    if (next < 0) {
      bool all_exited = true;
      for (State s : states_) all_exited = all_exited && s == State::kExited;
      if (!all_exited) abort("deadlock: a barrier that not every thread reaches");
    } else {
      current_ = next;
      wake_[next].notify_one();
    }
    wait_turn(self, lock);
  }

  void wait_turn(int self, std::unique_lock<std::mutex>& lock) {
    wake_[self].wait(lock, [&] { return current_ == self || aborted_ || done_; });
    if (aborted_) throw Aborted{};
  }

  const int num_threads_;
  std::mutex mu_;
  std::vector<State> states_;
  std::vector<std::condition_variable> wake_;
  std::vector<uint64_t> exchange_;
  std::vector<int> parity_;
  int current_ = 0;
  bool aborted_ = false;
  bool done_ = false;
  std::string error_;
};

inline thread_local Scheduler* scheduler = nullptr;

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
  Scheduler sched(block.x);
  std::vector<std::thread> threads;
  for (unsigned tid = 0; tid < block.x; ++tid) {
    threads.emplace_back([&, tid] {
      scheduler = &sched;
      threadIdx = dim3(tid);
      try {
        sched.wait_first_turn(tid);
        for (unsigned b = 0; b < num_blocks; ++b) {
          blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
          call(kernel, args, std::index_sequence_for<Params...>{});
          if (!sched.finish_block(tid, b + 1 == num_blocks)) break;
        }
      } catch (const Aborted&) {
      }
    });
  }
  for (auto& t : threads) t.join();
  return sched.error();
}

}  // namespace emu

inline void __syncthreads() { emu::scheduler->arrive(threadIdx.x, emu::State::kAtBlockBarrier); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::scheduler->fail("__syncwarp with a partial mask");
  emu::scheduler->arrive(threadIdx.x, emu::State::kAtWarpBarrier);
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  if (mask != 0xffffffffu || width != 32) emu::scheduler->fail("shuffle with a partial mask");
  return emu::scheduler->shuffle_xor(value, lane_mask);
}
