// The pool behind parallel_for (thread_pool.h). One process-wide pool;
// workers start on first need and then sleep on a condition variable between
// jobs, so an idle head burns no CPU. A job is a chunk counter on the
// caller's stack; the caller takes chunks too, so a job never waits for a
// worker to wake up before work starts, and a job smaller than the wake-up
// time ends before any worker arrives.
//
// Jobs do not queue: while one runs, another thread's parallel_for (several
// Heads used from several Python threads) and a parallel_for nested inside a
// chunk run inline on their own thread. Queueing would make a caller wait on
// another head's whole step and, for a nested call, on itself (a deadlock);
// running inline never blocks, keeps the machine at the pool's threads plus
// one per extra caller (no oversubscription on top), and the heads are
// memory-bound, so the bytes streamed per second change little either way.
//
// Idle workers beyond a baseline (default_threads() - 1: what a job at the
// default thread count uses) retire after kIdleRetire without a seat: each
// moves itself from the pool's workers to its retired list under the mutex
// and exits; the next job, or the process's exit, joins it. A process that
// once ran threads=256 does not carry 255 sleeping threads until exit, and a
// later job simply starts workers again. The baseline never retires, so a
// head at the default count never pays for starting threads twice.
//
// Exit: no thread of ours is ending while the process exits. A process that
// exits within a second of a many-thread job would otherwise have workers
// retiring (tearing down their thread-local storage) while exit handlers,
// LeakSanitizer's scan among them, run. An exit handler, registered when the
// library loads and so run before the sanitizer's (atexit runs in reverse),
// stops retirement and joins the workers that already retired; the rest
// sleep.
//
// fork(): only the forking thread exists in the child. The workers are gone
// and the pool's mutex may be held by a thread that no longer exists (a fork
// while another thread is in a parallel_for), so the child can neither use
// nor destroy the old pool (destroying a joinable std::thread terminates).
// An atfork handler forgets it instead: the child leaks one small object and
// its first parallel_for builds a fresh pool with fresh workers.
#if !defined(__APPLE__)  // Apple runs parallel_for on Grand Central Dispatch
#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <pthread.h>
#endif

#include "cpu/parallel.h"

namespace muser::cpu {

namespace {

// How long a worker beyond the baseline sleeps without a seat before it
// retires. Far longer than a head's step or the pause between steps of a
// loop (milliseconds), so a head with many threads keeps its workers while it
// is in use; short enough that they are gone soon after it stops.
constexpr std::chrono::milliseconds kIdleRetire{1000};

// One job; lives on the caller's stack until every worker has left it.
struct Job {
  Job(ChunkFn f, void* c, int64_t n) : fn(f), ctx(c), chunks(n) {}
  ChunkFn fn;
  void* ctx;
  int64_t chunks;
  std::atomic<int64_t> next{0};  // the next chunk to hand out
  std::exception_ptr error;      // the first exception thrown; guarded by Pool::mu_
};

class Pool {
 public:
  Pool() : keep_(std::max(0, default_threads() - 1)) {}

  // Claims the pool for one job; false while another job runs.
  bool try_claim() {
    bool idle = false;
    return busy_.compare_exchange_strong(idle, true, std::memory_order_acquire);
  }

  // Runs a claimed job with up to `helpers` workers and releases the claim.
  void run(Job& job, int helpers) {
    int seats;
    {
      std::lock_guard<std::mutex> lock(mu_);
      join_retired();
      grow(helpers);
      job_ = &job;
      seats = seats_ = std::min(helpers, (int)workers_.size());
    }
    for (int i = 0; i < seats; ++i) wake_.notify_one();
    work(job);
    {
      std::unique_lock<std::mutex> lock(mu_);
      seats_ = 0;  // every chunk is handed out: a worker waking now has nothing to do
      left_.wait(lock, [&] { return seated_ == 0; });
      job_ = nullptr;
    }
    busy_.store(false, std::memory_order_release);
    if (job.error) std::rethrow_exception(job.error);
  }

  int workers() {
    std::lock_guard<std::mutex> lock(mu_);
    return (int)workers_.size();
  }

  // From here on no worker retires, and those that did have ended.
  void stop_retiring() {
    std::lock_guard<std::mutex> lock(mu_);
    retiring_ = false;
    join_retired();
  }

 private:
  // Takes chunks until none is left. An exception stops the job: the
  // remaining chunks are skipped and the caller rethrows the first one.
  void work(Job& job) {
    try {
      for (int64_t c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) job.fn(job.ctx, c);
    } catch (...) {
      job.next.store(job.chunks, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(mu_);
      if (!job.error) job.error = std::current_exception();
    }
  }

  // Starts workers until there are `n` (called with mu_ held). When the OS
  // refuses a thread (or memory) the job runs with the workers there are.
  void grow(int n) {
    try {
      // push_back below, and retire()'s into retired_ (empty: run() joined
      // it), cannot throw after this
      workers_.reserve((size_t)n);
      retired_.reserve((size_t)n);
      while ((int)workers_.size() < n) workers_.push_back(new std::thread([this] { worker_main(); }));
    } catch (...) {
    }
  }

  void worker_main() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (!wake_.wait_for(lock, kIdleRetire, [&] { return seats_ > 0; })) {
        if (retire()) return;
        continue;
      }
      --seats_;
      ++seated_;
      Job& job = *job_;
      lock.unlock();
      work(job);
      lock.lock();
      if (--seated_ == 0) left_.notify_one();
    }
  }

  // Called with mu_ held by an idle worker with no seat to take (seats_ == 0,
  // so no job counts on it): while the pool has more workers than it keeps,
  // moves the calling worker's thread from workers_ to retired_ and returns
  // true; the worker then exits. run() counts seats under mu_, so it never
  // counts a worker that has left. grow() pushed the thread before this
  // worker could take mu_, so it is found.
  bool retire() {
    if (!retiring_ || (int)workers_.size() <= keep_) return false;
    const auto self = std::find_if(workers_.begin(), workers_.end(),
                                   [](std::thread* t) { return t->get_id() == std::this_thread::get_id(); });
    if (self == workers_.end()) return false;
    retired_.push_back(*self);  // reserved in grow(): cannot throw
    *self = workers_.back();    // order does not matter
    workers_.pop_back();
    return true;
  }

  // Joins the workers that retired (called with mu_ held). That cannot
  // deadlock: a retired worker let go of mu_ before we could take it, and its
  // thread's end needs nothing of the pool's.
  void join_retired() {
    for (std::thread* t : retired_) {
      t->join();
      delete t;
    }
    retired_.clear();  // keeps the capacity grow() reserved
  }

  std::atomic<bool> busy_{false};  // a job holds the pool
  std::mutex mu_;
  std::condition_variable wake_;  // workers wait here for a seat
  std::condition_variable left_;  // the caller waits here for seated workers to leave
  Job* job_ = nullptr;
  int seats_ = 0;   // workers that may still join job_
  int seated_ = 0;  // workers inside job_
  const int keep_;  // workers that never retire
  bool retiring_ = true;  // false once the process exits (stop_retiring())
  // Never joined: they live until exit, or are forgotten with the pool in a
  // forked child, where joining (or destroying) them would hang or terminate.
  std::vector<std::thread*> workers_;
  std::vector<std::thread*> retired_;  // workers that retired, not yet joined
};

std::atomic<Pool*> g_pool{nullptr};

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  Pool* fresh = new Pool();  // starts no thread: cheap to throw away
  if (g_pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *p;
}

#if !defined(_WIN32)
void forget_pool_in_child() { g_pool.store(nullptr, std::memory_order_relaxed); }

// Registered when the library loads, before any thread of ours exists.
[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, forget_pool_in_child);
#endif

// Registered when the library loads, after the sanitizer runtime (loaded or
// initialised first) registered its leak check, so this runs before it. A
// forked child inherits it.
[[maybe_unused]] const int g_atexit_registered = std::atexit(prepare_pool_for_exit);

}  // namespace

void run_chunks(int64_t chunks, int threads, ChunkFn fn, void* ctx) {
  if (chunks <= 0) return;
  const int64_t helpers = std::min<int64_t>(std::min(threads, kMaxThreads) - 1, chunks - 1);
  Pool* p = helpers > 0 ? &pool() : nullptr;
  if (!p || !p->try_claim()) {
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
    return;
  }
  Job job{fn, ctx, chunks};
  p->run(job, (int)helpers);
}

int pool_workers() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  return p ? p->workers() : 0;
}

void prepare_pool_for_exit() {
  // In a forked child g_pool is the child's own pool or null, never the
  // parent's (whose mutex may be held by a thread that does not exist here).
  if (Pool* p = g_pool.load(std::memory_order_acquire)) p->stop_retiring();
}

}  // namespace muser::cpu
#endif
