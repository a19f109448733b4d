#include "model/thread_team.h"

#include <algorithm>
#include <exception>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVQ_PAUSE() _mm_pause()
#else
#define KVQ_PAUSE() ((void)0)
#endif

namespace kvq {

ThreadTeam::ThreadTeam(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadTeam::~ThreadTeam() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

// Spin (about 100 microseconds), then yield the core, then sleep on the futex.
void ThreadTeam::wait_while_equal(const std::atomic<uint32_t>& a, uint32_t old) {
  for (int i = 0; i < 2000; ++i) {
    if (a.load(std::memory_order_acquire) != old) return;
    KVQ_PAUSE();
  }
  for (int i = 0; i < 200; ++i) {
    if (a.load(std::memory_order_acquire) != old) return;
    std::this_thread::yield();
  }
  while (a.load(std::memory_order_acquire) == old) a.wait(old, std::memory_order_acquire);
}

void ThreadTeam::barrier() {
  const int n = size();
  if (n == 1) return;
  const uint32_t ph = phase_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    arrived_.store(0, std::memory_order_relaxed);
    phase_.fetch_add(1, std::memory_order_release);
    phase_.notify_all();
  } else {
    wait_while_equal(phase_, ph);
  }
}

void ThreadTeam::worker(int member) {
  uint32_t seen = 0;
  for (;;) {
    wait_while_equal(generation_, seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    try {
      (*job_)(member);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    running_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadTeam::run(const std::function<void(int)>& f) {
  job_ = &f;
  running_.store(size() - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  std::exception_ptr err;
  try {
    f(0);
  } catch (...) {
    err = std::current_exception();
  }
  for (int i = 0; running_.load(std::memory_order_acquire) != 0; ++i) {
    if (i < 2000)
      KVQ_PAUSE();
    else
      std::this_thread::yield();
  }
  job_ = nullptr;
  {
    const std::lock_guard<std::mutex> lock(error_mutex_);
    if (!err) err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

double AutoThreads::Arm::estimate() const {
  const double a = last[0], b = last[1], c = last[2];
  return std::max(std::min(a, b), std::min(std::max(a, b), c));
}

int AutoThreads::next(int64_t tokens) {
  if (cores_ == 1) return 1;
  Kind& k = kind(tokens);
  const int64_t pass = k.passes++;
  if (k.arms[0].passes < 3 || k.arms[1].passes < 3) return pass % 2 == 0 ? cores_ : 1;
  const int best = k.arms[0].estimate() <= k.arms[1].estimate() ? 0 : 1;
  const int pick = pass % kProbe == kProbe - 1 ? 1 - best : best;
  return pick == 0 ? cores_ : 1;
}

void AutoThreads::record(int members, int64_t tokens, double seconds) {
  if (cores_ == 1 || tokens < 1) return;
  Arm& a = kind(tokens).arms[members == 1 ? 1 : 0];
  a.last[a.passes % 3] = seconds / static_cast<double>(tokens);
  ++a.passes;
}

}  // namespace kvq
