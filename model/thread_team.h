// A persistent team of threads for the model's forward pass: the workers live as long as the team,
// and the barrier spins briefly, then yields the core, then sleeps. On a machine shared with other
// work a pure spin-wait (OpenMP's default) burns the core a preempted teammate needs, and a pure
// sleep costs a wake-up per barrier (the forward pass has ~9 barriers per layer).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvq {

class ThreadTeam {
 public:
  /// \brief A team of `threads` (>= 1) members; member 0 is the thread that calls run().
  explicit ThreadTeam(int threads);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// \brief Runs f(member) on every member and returns when all have finished. An exception
  /// thrown by f is rethrown here (the first one); f must then still reach every barrier() the
  /// other members reach, so throw only outside barrier-separated phases.
  void run(const std::function<void(int)>& f);

  /// \brief Waits until every member has arrived (call from inside run()).
  void barrier();

  /// \brief [begin, end) of `n` items for `member`: contiguous, sizes differing by at most one.
  static std::pair<int64_t, int64_t> split(int64_t n, int member, int members) {
    return {n * member / members, n * (member + 1) / members};
  }

 private:
  void worker(int member);
  static void wait_while_equal(const std::atomic<uint32_t>& a, uint32_t old);

  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};  // bumped per run()
  std::atomic<int> running_{0};          // members still inside the current job
  std::atomic<bool> stop_{false};
  // Barrier: arrivals counted, the phase bumped by the last arrival.
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> phase_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first exception a worker's job threw
};

/// \brief How many members a pass runs with when the caller leaves it to kvq (threads = 0): the
/// faster per token, measured on the passes themselves, of all `cores` and of one. On an idle
/// machine all cores win. With another process busy on a core, the scheduler parks a member for a
/// time slice now and then, and every barrier of the pass (about 9 a layer) waits for it: one
/// thread on the free core then wins (issue 50 item 10: 42.9 tokens/s decoding with 2 threads
/// beside a busy loop, 130.7 with 1). Passes of one token (decode) and of more (prefill) are
/// judged apart. The first six passes alternate; then each count's median of its last three passes
/// decides, and every kProbe-th pass runs the other count, so the choice follows the load.
class AutoThreads {
 public:
  static constexpr int kProbe = 16;
  explicit AutoThreads(int cores) : cores_(cores < 1 ? 1 : cores) {}
  int cores() const { return cores_; }
  /// \brief Members for the next pass of `tokens` tokens.
  int next(int64_t tokens);
  /// \brief What a pass of `tokens` tokens with `members` members took (wall seconds).
  void record(int members, int64_t tokens, double seconds);

 private:
  struct Arm {
    double last[3] = {0, 0, 0};  // seconds per token of its last three passes
    int passes = 0;
    double estimate() const;  // their median (robust to one disturbed pass)
  };
  struct Kind {
    Arm arms[2];  // [0]: all cores, [1]: one
    int64_t passes = 0;
  };
  Kind& kind(int64_t tokens) { return kinds_[tokens > 1 ? 1 : 0]; }
  int cores_;
  Kind kinds_[2];  // [0]: decode (one token), [1]: prefill
};

}  // namespace kvq
