// model/thread_team: every member runs the job, barriers order the phases, an exception reaches
// the caller, and the team is reusable. Expected values are counts worked out by hand.
#include "model/thread_team.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace kvq {
namespace {

TEST(ThreadTeam, EveryMemberRunsAndBarriersOrderPhases) {
  for (int n : {1, 2, 3}) {
    ThreadTeam team(n);
    ASSERT_EQ(team.size(), n);
    std::vector<int> phase1(static_cast<size_t>(n), 0);
    std::atomic<int> bad{0};
    for (int rep = 0; rep < 50; ++rep) {  // reuse: 50 jobs on the same team
      team.run([&](int me) {
        phase1[static_cast<size_t>(me)] = rep + 1;
        team.barrier();
        for (int j = 0; j < n; ++j)  // after the barrier every member's phase-1 write is visible
          if (phase1[static_cast<size_t>(j)] != rep + 1) ++bad;
        team.barrier();
      });
    }
    EXPECT_EQ(bad.load(), 0) << n << " members";
  }
}

TEST(ThreadTeam, ExceptionReachesTheCallerAndTheTeamStaysUsable) {
  ThreadTeam team(2);
  EXPECT_THROW(team.run([](int me) {
    if (me == 1) throw std::runtime_error("worker failed");
  }),
               std::runtime_error);
  EXPECT_THROW(team.run([](int me) {
    if (me == 0) throw std::runtime_error("caller failed");
  }),
               std::runtime_error);
  std::atomic<int> ran{0};
  team.run([&](int) { ++ran; });
  EXPECT_EQ(ran.load(), 2);
}

TEST(ThreadTeam, SplitCoversEveryItemOnce) {
  for (int64_t n : {0, 1, 5, 64, 1000})
    for (int members : {1, 2, 3, 7}) {
      int64_t next = 0;
      for (int m = 0; m < members; ++m) {
        const auto [b, e] = ThreadTeam::split(n, m, members);
        EXPECT_EQ(b, next);
        EXPECT_LE(e - b, n / members + 1);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
}

}  // namespace
}  // namespace kvq

// Issue 50 item 10: with --threads 0 the model picks, per pass, between all cores and one by
// measuring both. Simulated passes (seconds per token given by the test, not measured): the
// faster count wins, the choice follows when the machine's load changes, and decode and prefill
// passes are judged apart.
namespace {
// Runs `passes` passes of `tokens` tokens through `a`, timing a pass with m members as
// cost(m) * tokens; returns how many ran with one member.
template <class Cost>
int run_passes(kvq::AutoThreads& a, int passes, int64_t tokens, Cost cost) {
  int solo = 0;
  for (int i = 0; i < passes; ++i) {
    const int m = a.next(tokens);
    EXPECT_TRUE(m == 1 || m == a.cores()) << m;
    solo += m == 1;
    a.record(m, tokens, cost(m) * static_cast<double>(tokens));
  }
  return solo;
}
}  // namespace

TEST(AutoThreads, PicksTheFasterCount_followsTheLoad_decodeAndPrefillApart) {
  kvq::AutoThreads a(2);
  const auto idle = [](int m) { return m == 2 ? 1.0 : 1.9; };  // two threads win
  const auto busy = [](int m) { return m == 2 ? 3.0 : 1.3; };  // a shared core: one wins
  // 6 alternating passes, then the faster with a probe every kProbe-th pass
  const int n = 6 + 4 * kvq::AutoThreads::kProbe;
  EXPECT_LE(run_passes(a, n, 1, idle), 3 + 4) << "idle: mostly all cores";
  const int solo = run_passes(a, n, 1, busy);
  EXPECT_GE(solo, n - 4 - 2 * kvq::AutoThreads::kProbe) << "busy: one core after the probes";
  // the last kProbe passes under load are all solo but one probe at most
  EXPECT_GE(run_passes(a, kvq::AutoThreads::kProbe, 1, busy), kvq::AutoThreads::kProbe - 1);
  // prefill still has its own (idle) history: it starts alternating, then picks all cores
  EXPECT_LE(run_passes(a, n, 512, idle), 3 + 4);
  // one disturbed pass does not flip the choice (a median of three)
  kvq::AutoThreads b(2);
  run_passes(b, 6, 1, idle);
  int k = 0;
  const auto spike = [&k](int m) { return ++k == 3 && m == 2 ? 50.0 : (m == 2 ? 1.0 : 1.9); };
  EXPECT_LE(run_passes(b, 8, 1, spike), 1);
}

TEST(AutoThreads, OneCore_alwaysOne) {
  kvq::AutoThreads a(1);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(a.next(i % 3 + 1), 1);
}
