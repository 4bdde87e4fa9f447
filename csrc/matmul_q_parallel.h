// Runs the blocks of one FFI call on the calling thread and on tasks of XLA's
// intra-op thread pool (the FFI execution context's ThreadPool): all take block
// indices from one shared atomic counter, so a task that starts late finds no
// work and returns at once and the call never waits for a task that has not
// begun. No thread is ever created. The job is reference-counted: a late task
// may outlive the call, never the job. A helper task that has done its part stays on
// its pool thread for a short while and joins the next call's job at once (LingerForJobs:
// the calls of a model's step come faster than a sleeping pool thread wakes).
#ifndef HXMLIR_CSRC_MATMUL_Q_PARALLEL_H_
#define HXMLIR_CSRC_MATMUL_Q_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "thread_buffer.h"
#include "xla/ffi/api/ffi.h"

namespace hxmlir {

// Regime bounds and block plans shared by both handlers (hx_matmul_q_cpu_v1 and
// _v2), from the study of the int8 kernel's regimes.
constexpr int64_t kRowsMaxM = 4;  // "rows" regime (chunks of k) for m <= this
// "rows": at least this many rows of q per chunk of the contraction axis, and at
// most this many chunks (enough blocks for the threads of a bandwidth-bound loop).
constexpr int64_t kRowsMinChunk = 256;
constexpr int64_t kRowsMaxChunks = 8;
// Column blocks: at most this many columns (the "packed" regime's and version 2's
// decoded block of q is 256 rows x this many columns), and about kBlocksPerThread
// blocks per thread (the shared counter then evens out a thread that starts late or
// runs slower; 8 rather than 4 halves the wait for the last block: all-MiniLM-L6-v2's
// step 1.06x -> 1.05x f32).
constexpr int64_t kMaxBlockColumns = 256;
constexpr int64_t kBlocksPerThread = 8;
// Problems under this many multiply-adds run on the calling thread alone.
constexpr int64_t kSerialMacs = int64_t{1} << 18;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of one batch element: `len` rows of q or columns each, `count` of them.
struct Blocking {
  int64_t len, count;
};

// "rows": chunks of k fixed by k alone (never by the thread count), so every
// machine adds the same partial sums in the same order.
inline Blocking ChunksOfK(int64_t k) {
  const int64_t len = CeilDiv(k, std::clamp<int64_t>(k / kRowsMinChunk, 1, kRowsMaxChunks));
  return {len, CeilDiv(k, len)};
}

// Column blocks of whole micro-panels of nr columns, at most kMaxBlockColumns wide,
// narrower when that gives every thread about kBlocksPerThread blocks.
inline Blocking ColumnBlocks(int64_t n, int64_t nb, int64_t nr, int64_t threads) {
  const int64_t per = CeilDiv(CeilDiv(n, CeilDiv(kBlocksPerThread * threads, nb)), nr);
  const int64_t len = std::clamp<int64_t>(per * nr, nr, std::max(nr, kMaxBlockColumns / nr * nr));
  return {len, CeilDiv(n, len)};
}

// The cores this process may run on: its affinity mask's count (sched_getaffinity, which
// taskset, cgroups' cpusets and container runtimes set), else
// std::thread::hardware_concurrency(), at least 1. Read once (the first call: the
// extension's max_threads(), which hxmlir calls when it loads the kernel).
inline int64_t UsableCores() {
  static const int64_t cores = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
      return static_cast<int64_t>(CPU_COUNT(&set));
#endif
    return std::max<int64_t>(1, std::thread::hardware_concurrency());
  }();
  return cores;
}

// Threads for a problem of `macs` multiply-adds: the calling thread alone when small,
// else one per usable core and no more than the pool's threads plus the caller's.
// XLA's intra-op pool has max(cores, host devices) threads: with
// --xla_force_host_platform_device_count=8 on 2 cores, 8 (measured: 8 busy threads on
// 2 cores, 1.4 -> 8.4 context switches per call); the blocks are planned for this count.
inline int64_t ThreadsFor(xla::ffi::ThreadPool& pool, int64_t macs) {
  if (macs < kSerialMacs) return 1;
  return std::clamp<int64_t>(pool.num_threads(), 1, UsableCores());
}

// "rows": y[b] += partial[b, c - 1] for the chunks c = 1 .. chunks - 1 of each batch
// element b (chunk 0 was written to y itself), in chunk order.
inline void AddPartialSums(float* y, const float* partial, int64_t nb, int64_t chunks,
                           int64_t mn) {
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 1; c < chunks; ++c) {
      const float* pc = partial + (b * (chunks - 1) + c - 1) * mn;
      for (int64_t e = 0; e < mn; ++e) y[b * mn + e] += pc[e];
    }
}

// Buffers of a thread, reused by its next calls and blocks: allocating one per call
// (a std::vector of 200 KiB or more is an mmap, its pages faulted in and zeroed every
// time) cost 10-15% of all-MiniLM-L6-v2's step. Each holds the largest size asked of
// it on this thread. The calling thread's x * s (kXs) and partial sums (kPartial) live
// for one call: its blocks are all done before it returns, so no other thread reads
// them after that; kScratch is a block's scratch (the decoded block of q), on whichever
// thread runs the block.
enum ThreadBufferSlot { kXs, kPartial, kScratch, kThreadBufferSlots };

// Each starts on a cache line (AlignedFloats).
inline float* ThreadBuffer(ThreadBufferSlot slot, int64_t floats) {
  thread_local std::vector<float> buffers[kThreadBufferSlots];
  return AlignedFloats(buffers[slot], floats);
}

// Writes x: f32[m, k] (times s: f32[k] along k, where s is not null) into out in
// groups of mr rows (the last group may be smaller), each group column after column:
// element (i, kk) at out + i0 * k + kk * g + (i - i0), i0 = i / mr * mr,
// g = min(mr, m - i0), so a register-tiled loop reads a group sequentially. For mr = 1
// that is x's own row-major layout, written in one pass the compiler vectorises (the
// transposing loop's order cost 2-5% at large m).
inline void PackRowGroups(const float* x, const float* s, int64_t m, int64_t k, int64_t mr,
                          float* out) {
  for (int64_t i0 = 0; i0 < m; i0 += mr) {
    const int64_t g = std::min(mr, m - i0);
    const float* xg = x + i0 * k;
    float* d = out + i0 * k;
    if (g == 1 && s != nullptr) {
      for (int64_t kk = 0; kk < k; ++kk) d[kk] = xg[kk] * s[kk];
    } else if (g == 1) {
      std::copy(xg, xg + k, d);
    } else {
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t r = 0; r < g; ++r) d[kk * g + r] = s ? xg[r * k + kk] * s[kk] : xg[r * k + kk];
    }
  }
}

// About this many floats of x per task of XPack (64 KiB): all-MiniLM-L6-v2's x: f32[128, 384]
// is 3 tasks, f32[128, 1536] 12.
constexpr int64_t kPackChunkFloats = int64_t{1} << 14;

// PackRowGroups of one call cut into tasks of whole groups of rows, run by whichever
// thread takes them first: the calling thread before its helpers have woken, the
// helpers beside it once they have. Packed serially, x * s was ~6% of
// all-MiniLM-L6-v2's step on the 2-core VM: 23-75 us per call, x coming from the
// other core's cache (it wrote half of the previous layer's y), the helper idle.
// A block of the job waits for every task of the pack (Wait) before it reads out.
struct XPack {
  const float* x = nullptr;
  const float* s = nullptr;  // null: x alone
  float* out = nullptr;
  int64_t m = 0, k = 0, mr = 1, rows = 0, per_batch = 0, chunks = 0;
  std::atomic<int64_t> done{0};

  // Pack x: f32[nb, m, k] (times s: f32[nb, k]) into out: f32[nb, m, k], each batch
  // element in groups of mr rows (PackRowGroups), in tasks of about kPackChunkFloats
  // floats (a multiple of mr rows each).
  void Plan(const float* x_, const float* s_, int64_t nb, int64_t m_, int64_t k_, int64_t mr_,
            float* out_) {
    x = x_, s = s_, out = out_, m = m_, k = k_, mr = mr_;
    const int64_t per = std::max<int64_t>(1, CeilDiv(m * k, kPackChunkFloats));
    rows = CeilDiv(CeilDiv(m, per), mr) * mr;
    per_batch = CeilDiv(m, rows);
    chunks = nb * per_batch;
  }
  // Task c: rows [r0, r0 + rows) of batch element c / per_batch. The groups of mr rows
  // start at multiples of mr, as those of one PackRowGroups over the whole element.
  void Run(int64_t c) {
    const int64_t b = c / per_batch, r0 = c % per_batch * rows;
    PackRowGroups(x + (b * m + r0) * k, s == nullptr ? nullptr : s + b * k,
                  std::min(rows, m - r0), k, mr, out + (b * m + r0) * k);
    done.fetch_add(1, std::memory_order_release);
  }
  // Returns once every task has run (each runs on a thread that has begun it).
  void Wait() const {
    while (done.load(std::memory_order_acquire) < chunks) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
};

// The product of dims[0 : rank - 2]: the batch elements of x: f32[*b, m, k].
inline int64_t BatchSize(xla::ffi::Span<const int64_t> dims) {
  int64_t nb = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) nb *= dims[i];
  return nb;
}

// Whether a call f32[nb, m, k] @ [nb, k, n] has nothing to compute: y: f32[nb, m, n] is
// empty, or k is 0 and y is zeros (written here).
inline bool NothingToCompute(int64_t nb, int64_t m, int64_t k, int64_t n, float* y) {
  if (nb == 0 || m == 0 || n == 0) return true;
  if (k == 0) std::fill(y, y + nb * m * n, 0.f);
  return k == 0;
}

// "[2,3]": the dims of a buffer, for error messages.
inline std::string ShapeText(xla::ffi::Span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

// The counters a job shares between its threads: tasks [0, pack.chunks) pack x (none
// in the "rows" regime), tasks [pack.chunks, tasks()) are the blocks 0 .. total - 1.
struct BlockCounter {
  int64_t total = 0;  // blocks
  XPack pack;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> started{0};  // helper tasks that have started
  int64_t tasks() const { return pack.chunks + total; }
};

// The blocks of one call, as both handlers cut it: per batch element
// `blocks_per_batch` blocks of `block_len` rows of q (the "rows" regime: chunks of
// k, whose partial sums beyond the first go to `partial`) or of columns.
struct BlockedJob : BlockCounter {
  int64_t blocks_per_batch = 0;
  int64_t block_len = 0;
  float* partial = nullptr;  // "rows": chunks 1.. of each batch element, f32[nb, chunks-1, m, n]

  void Plan(int64_t nb, Blocking blocking) {
    block_len = blocking.len;
    blocks_per_batch = blocking.count;
    total = nb * blocking.count;
  }
  // "rows": chunks of k (ChunksOfK), their partial sums in the calling thread's kPartial.
  void PlanRows(int64_t nb, int64_t m, int64_t k, int64_t n) {
    Plan(nb, ChunksOfK(k));
    partial = ThreadBuffer(kPartial, nb * (blocks_per_batch - 1) * m * n);
  }
  // "rows": where chunk c of batch element b sums (mn = m * n): y itself for chunk 0.
  float* RowsAcc(float* y, int64_t b, int64_t c, int64_t mn) const {
    return c == 0 ? y + b * mn : partial + (b * (blocks_per_batch - 1) + c - 1) * mn;
  }
  // "rows", after RunBlocks: y += the partial sums of chunks 1.., in chunk order.
  void AddPartials(float* y, int64_t nb, int64_t mn) const {
    AddPartialSums(y, partial, nb, blocks_per_batch, mn);
  }
};

// A helper task that has not started this long after the call scheduled it is
// queued behind other work or on a thread that was asleep: one more is scheduled
// (checked by the calling thread after each task it runs, so with long blocks at
// the end of its first block that ends later than this).
constexpr std::chrono::nanoseconds kLateHelper{30'000};

// Takes tasks from job's counter and runs them until none is left (a pack task, or
// job.Run(block) once the pack is complete), calling after_task() after each.
template <class Job, class AfterTask>
void WorkOn(Job& job, AfterTask after_task) {
  const int64_t tasks = job.tasks();
  for (;;) {
    const int64_t t = job.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= tasks) return;
    if (t < job.pack.chunks) {
      job.pack.Run(t);
    } else {
      job.pack.Wait();
      job.Run(t - job.pack.chunks);
    }
    if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) job.done.notify_all();
    after_task();
  }
}

// --- helpers that stay for the next call ------------------------------------------
//
// A decode step calls the kernels ~180 times, 5-30 us apart (SmolLM2-135M: five
// matmul calls and one attention call per layer, XLA's small ops between them), each
// call 10-150 us long. XLA's pool
// threads fall asleep between calls and take 50-300 us to wake on a VM (measured:
// SmolLM2's o projection took 73 us a call inside the step, 24 us on one thread
// alone), so a helper scheduled on the pool came late or not at all. Instead, a helper
// that has done its part of a call stays on its pool thread for up to Linger() (50 us
// unless set: the extension's set_linger_us, which hxmlir calls at import with
// $HXMLIR_CPU_LINGER_US, lowering/matmul_q/cpu.py), spinning on
// the hand-off slot below: the next call hands its job there and the helper starts at
// once (every lingering helper joins it: a call's blocks come from one shared counter).
// The calling thread never waits for a hand-off: it takes blocks from the counter as
// before, and if no helper has started after kLateHelper it schedules pool tasks as well
// (a helper that stopped lingering just as the job came).
// A lingering helper spins on one core for at most Linger() after the last call, yielding
// it to any ready thread. 50 us covers the gaps inside a decode step; longer costs more
// than it saves on a loaded machine (SmolLM2's step, 2-core Zen 4 VM, interleaved: quiet
// 23.9 ms -> 18.8 ms at 50 us, 19.9 at 250; with other processes on both cores 31 ms ->
// 34 ms at 50 us, 50 ms at 250).

// The hand-off slot: a job, as its type-erased runner and owner, and a count of posts.
struct Handoff {
  std::mutex mu;                       // guards job and run
  std::shared_ptr<void> job;           // the last job posted (null: none yet); every
                                       // lingering helper copies it, the next post drops it
  void (*run)(void*) = nullptr;        // runs job's blocks (WorkOn)
  std::atomic<uint64_t> posts{0};      // incremented by each post, after job is set
  std::atomic<int> waiting{0};         // helpers lingering now
  std::atomic<int64_t> linger_ns{50'000};
};

// One for the process, never destroyed (a pool thread may linger past static destructors).
inline Handoff& TheHandoff() {
  static Handoff* h = new Handoff;
  return *h;
}

inline std::chrono::nanoseconds Linger() {
  return std::chrono::nanoseconds(TheHandoff().linger_ns.load(std::memory_order_relaxed));
}

// Sets Linger() (microseconds; 0: helpers never linger).
inline void SetLingerMicros(int64_t us) {
  TheHandoff().linger_ns.store(std::max<int64_t>(0, us) * 1000, std::memory_order_relaxed);
}

template <class Job>
void HelpWith(void* job) {
  Job& j = *static_cast<Job*>(job);
  j.started.fetch_add(1, std::memory_order_relaxed);
  WorkOn(j, [] {});
}

// Hands job to the lingering helpers, if any wait: each joins it. Returns how many were
// waiting (one may still stop lingering before it sees the job: RunBlocks checks).
template <class Job>
int64_t HandOff(const std::shared_ptr<Job>& job) {
  Handoff& h = TheHandoff();
  const int64_t waiting = h.waiting.load(std::memory_order_acquire);
  if (waiting == 0) return 0;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.job = job;
    h.run = &HelpWith<Job>;
  }
  h.posts.fetch_add(1, std::memory_order_release);
  return waiting;
}

// On a pool thread that has helped with a call: runs the jobs handed off while they come
// less than Linger() apart, then returns the thread to the pool.
inline void LingerForJobs() {
  Handoff& h = TheHandoff();
  const auto linger = Linger();
  if (linger.count() == 0) return;
  h.waiting.fetch_add(1, std::memory_order_acq_rel);
  uint64_t seen = h.posts.load(std::memory_order_acquire);
  auto until = std::chrono::steady_clock::now() + linger;
  for (int spin = 0;; ++spin) {
    if (h.posts.load(std::memory_order_acquire) != seen) {
      std::shared_ptr<void> job;
      void (*run)(void*) = nullptr;
      {
        std::lock_guard<std::mutex> lock(h.mu);
        job = h.job;  // every lingering helper joins the job
        run = h.run;
        seen = h.posts.load(std::memory_order_acquire);
      }
      if (job != nullptr) {
        h.waiting.fetch_sub(1, std::memory_order_acq_rel);
        run(job.get());
        h.waiting.fetch_add(1, std::memory_order_acq_rel);
        until = std::chrono::steady_clock::now() + linger;
      }
      continue;
    }
    if ((spin & 15) == 0 && std::chrono::steady_clock::now() > until) break;
    // yield the core to any thread that is ready (the calling thread's process, others)
    std::this_thread::yield();
  }
  h.waiting.fetch_sub(1, std::memory_order_acq_rel);
}

// One pool task that helps with job's blocks (counted in job->started when it begins),
// then lingers for the next calls' (LingerForJobs).
template <class Job>
void ScheduleHelper(xla::ffi::ThreadPool& pool, const std::shared_ptr<Job>& job) {
  pool.Schedule([job] {
    HelpWith<Job>(job.get());
    LingerForJobs();
  });
}

// Runs the pack tasks, then job->Run(t) for every block t in [0, job->total), on the
// calling thread and on tasks of XLA's intra-op pool (`threads`: the pool's size, or 1 for a small
// problem), and returns when all have run. The pool has a thread per core, so the
// calling thread and threads - 1 tasks make one busy thread per core: one task
// more would, whenever the pool's threads are awake (inside a model's step), put
// three threads on two cores (measured on the 2-core VM, a jitted chain of
// 16 x 512 x 2048 layers: 347 us per call with one task per pool thread, the
// calling thread doing 35% of the blocks; 238 us with one fewer, doing 50%).
// When none of the tasks has started kLateHelper after the call began (its pool
// thread was asleep or busy: 50-300 us to wake on this VM), one more is
// scheduled, for another thread (the calling thread checks after each of its
// tasks). A task that starts late finds nothing left and returns at once.
// Job: derives from BlockCounter and has void Run(int64_t block).
template <class Job>
void RunBlocks(xla::ffi::ThreadPool& pool, int64_t threads, const std::shared_ptr<Job>& job) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t tasks = job->tasks();
  const int64_t helpers = threads > 1 ? std::min(threads - 1, tasks - 1) : 0;
  int64_t spare = threads > 1 ? std::min(threads, tasks - 1) - helpers : 0;
  // to the lingering helpers, if any wait; pool tasks for the rest, and for them if none
  // has started in time
  const int64_t handed = helpers > 0 ? std::min(helpers, HandOff(job)) : 0;
  spare += handed;
  for (int64_t h = handed; h < helpers; ++h) ScheduleHelper(pool, job);
  WorkOn(*job, [&] {  // after each task of the calling thread: is a helper late?
    if (spare > 0 && job->started.load(std::memory_order_relaxed) == 0 &&
        std::chrono::steady_clock::now() - start > kLateHelper)
      for (; spare > 0; --spare) ScheduleHelper(pool, job);
  });
  for (int64_t d = job->done.load(std::memory_order_acquire); d < tasks;
       d = job->done.load(std::memory_order_acquire))
    job->done.wait(d, std::memory_order_acquire);
}

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_MATMUL_Q_PARALLEL_H_
