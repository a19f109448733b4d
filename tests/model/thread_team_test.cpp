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
