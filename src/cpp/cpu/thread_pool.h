// muser's own worker pool, behind parallel_for on every platform but Apple
// (which uses Grand Central Dispatch). It replaces OpenMP because GCC's
// libgomp does not survive fork(): a process that ran a head and then forked
// (multiprocessing's fork mode, data-loader workers) hung in the child's
// first parallel region. The pool is reset in a forked child and rebuilt
// there on first use (thread_pool.cpp says how).
#pragma once
#include <cstdint>

namespace muser::cpu {

// Calls fn(ctx, c) once for every chunk c in [0, chunks), from at most
// `threads` threads: the calling thread and up to threads - 1 pool workers,
// which take chunks one at a time from a shared counter (dynamic scheduling).
// Returns when every chunk has run. If fn throws, chunks not yet started are
// skipped and the first exception is rethrown here. A call made while the
// pool runs another job (from another thread, or nested inside a chunk) runs
// its chunks on the calling thread alone.
using ChunkFn = void (*)(void* ctx, int64_t chunk);
void run_chunks(int64_t chunks, int threads, ChunkFn fn, void* ctx);

// Workers the pool holds now (0 in a freshly forked child until its first
// parallel job; those beyond default_threads() - 1 retire after a second
// idle). For the tests.
int pool_workers();

// What the process's exit runs (an atexit handler the pool registers): from
// now on no worker retires, and workers that already retired have ended, so
// no thread of the pool is exiting while the process exits. For the tests.
void prepare_pool_for_exit();

}  // namespace muser::cpu
