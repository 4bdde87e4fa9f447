// Runs the blocks of one FFI call on the calling thread and on tasks of XLA's
// intra-op thread pool (the FFI execution context's ThreadPool): all take block
// indices from one shared atomic counter, so a task that starts late finds no
// work and returns at once and the call never waits for a task that has not
// begun. No thread is ever created. The job is reference-counted: a late task
// may outlive the call, never the job.
#ifndef HXMLIR_CSRC_MATMUL_Q_PARALLEL_H_
#define HXMLIR_CSRC_MATMUL_Q_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace hxmlir {

// The counters a job shares between its threads.
struct BlockCounter {
  int64_t total = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// Job: derives from BlockCounter and has void Run(int64_t block).
template <class Job>
void WorkOn(Job& job) {
  for (;;) {
    const int64_t t = job.next.fetch_add(1, std::memory_order_relaxed);
    if (t >= job.total) return;
    job.Run(t);
    if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.total) job.done.notify_all();
  }
}

// Runs job->Run(t) for every t in [0, job->total) on at most `threads` threads
// (the caller and threads - 1 pool tasks) and returns when all have run.
template <class Job>
void RunBlocks(xla::ffi::ThreadPool& pool, int64_t threads, const std::shared_ptr<Job>& job) {
  const int64_t helpers = std::min(threads, job->total) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { WorkOn(*job); });
  WorkOn(*job);
  for (int64_t d = job->done.load(std::memory_order_acquire); d < job->total;
       d = job->done.load(std::memory_order_acquire))
    job->done.wait(d, std::memory_order_acquire);
}

}  // namespace hxmlir

#endif  // HXMLIR_CSRC_MATMUL_Q_PARALLEL_H_
