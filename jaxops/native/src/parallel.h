// Data-parallel loops on XLA's intra-op thread pool, the pool XLA:CPU runs its own loop
// fusions on (as many threads as the process may use; its size is XLA's, not ours).
//
// run_parts(pool, parts, body) calls body(p) for p in [0, parts); parallel_for(pool, n,
// grain, body) calls body(begin, end) on disjoint ranges covering [0, n), at most one
// range per pool thread and none shorter than `grain` items. The calling thread runs parts
// too and then waits only for parts other threads have already started, so a call cannot
// deadlock on a busy (or absent) pool: a task the pool starts late finds nothing left and
// returns without touching the caller's state. The parts run in any order, at once.
#ifndef JAXOPS_NATIVE_PARALLEL_H_
#define JAXOPS_NATIVE_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>

#include "xla/ffi/api/ffi.h"

namespace jaxops {

struct ParallelState {
  std::atomic<int64_t> next{0};
  int64_t finished = 0;
  bool failed = false;  // a range ran out of memory (rethrown on the calling thread)
  std::mutex mu;
  std::condition_variable all_done;
};

// Claims parts until none is left and runs them. `body` is only touched after a claim
// succeeds, i.e. while run_parts' caller still waits for that part.
template <typename Body>
void claim_parts(ParallelState& state, int64_t parts, const Body* body) {
  for (int64_t p; (p = state.next.fetch_add(1)) < parts;) {
    bool failed = false;
    try {
      (*body)(p);
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    std::lock_guard<std::mutex> lock(state.mu);
    state.failed |= failed;
    if (++state.finished == parts) state.all_done.notify_all();
  }
}

// How many parts of at least `grain` items n items make on this pool (1 when not worth it).
inline int64_t parts_for(xla::ffi::ThreadPool& pool, int64_t n, int64_t grain) {
  return std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1),
                           std::max<int64_t>(n / std::max<int64_t>(grain, 1), 1));
}

// body(p) for every p in [0, parts), on the calling thread and the pool; returns when all
// have run. Throws std::bad_alloc if a part did. `helpers` (default: parts - 1) caps the
// pool tasks scheduled: each claims parts until none is left, so fewer tasks than parts
// still run every part, and many small parts need not wake a task each.
template <typename Body>
void run_parts(xla::ffi::ThreadPool& pool, int64_t parts, const Body& body,
               int64_t helpers = -1) {
  helpers = helpers < 0 ? parts - 1 : std::min(helpers, parts - 1);
  if (parts <= 1 || helpers <= 0) {
    for (int64_t p = 0; p < parts; ++p) body(p);
    return;
  }
  auto state = std::make_shared<ParallelState>();
  for (int64_t t = 0; t < helpers; ++t)
    pool.Schedule([state, parts, b = &body] { claim_parts(*state, parts, b); });
  claim_parts(*state, parts, &body);
  std::unique_lock<std::mutex> lock(state->mu);
  state->all_done.wait(lock, [&] { return state->finished == parts; });
  if (state->failed) throw std::bad_alloc();
}

// A runner of `parts` parts on the pool (run(body) is run_parts(pool, parts, body,
// helpers)), for code written against a runner (radix_sort.h's OneThread is the
// one-thread one). ranges(n, body) calls body(begin, end) on disjoint ranges covering
// [0, n), one per part.
struct OnPool {
  xla::ffi::ThreadPool* pool;
  int64_t count;
  int64_t helpers = -1;  // pool tasks at most (-1: one per part but the caller's)
  int64_t parts() const { return count; }
  template <typename Body>
  void operator()(const Body& body) const { run_parts(*pool, count, body, helpers); }
  template <typename Body>
  void ranges(int64_t n, const Body& body) const {
    (*this)([&](int64_t p) { body(n * p / count, n * (p + 1) / count); });
  }
};

// body(begin, end) over disjoint ranges covering [0, n), one per part (see parts_for).
template <typename Body>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t n, int64_t grain, const Body& body) {
  OnPool{&pool, parts_for(pool, n, grain)}.ranges(n, body);
}

}  // namespace jaxops

#endif  // JAXOPS_NATIVE_PARALLEL_H_
