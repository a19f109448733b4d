// kivi/append_plan.h: the one KIVI append plan, checked exhaustively on small parameters against
// an independent step-by-step definition (REFERENCE.md section 3 applied literally, one token at a
// time): per-channel, a token joins the window and a window of B = (R > 0 ? R : G) tokens flushes
// whole; per-token, a token joins the window and the oldest leaves while it holds more than R.
#include "kivi/append_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/footprint.h"
#include "core/spec.h"

namespace kvq::kivi {
namespace {

// A side as token ids: the ids quantized so far in quantization order, and the window's ids,
// oldest first. Token i of the stream has id i.
struct Model {
  std::vector<int64_t> quantized;
  std::deque<int64_t> window;
};

// The definition, one token at a time (shares nothing with AppendRule).
void step(Model& m, Axis axis, int64_t group, int64_t residual, int64_t id) {
  m.window.push_back(id);
  if (axis == Axis::Channel) {
    const int64_t block = residual > 0 ? residual : group;
    if (static_cast<int64_t>(m.window.size()) == block) {
      m.quantized.insert(m.quantized.end(), m.window.begin(), m.window.end());
      m.window.clear();
    }
  } else {
    while (static_cast<int64_t>(m.window.size()) > residual) {
      m.quantized.push_back(m.window.front());
      m.window.pop_front();
    }
  }
}

std::string name(Axis axis, int64_t g, int64_t r, int64_t t, int64_t n) {
  std::string s = axis == Axis::Channel ? "channel" : "token";
  s += " G=" + std::to_string(g) + " R=" + std::to_string(r) + " T=" + std::to_string(t) +
       " n=" + std::to_string(n);
  return s;
}

// Expected: for every axis, G in 1..4, R in 0..12 (a multiple of G per-channel), every state of
// T in 0..30 tokens and every append of n in 0..30 tokens, carrying out the plan (steps 1-4 of
// kivi/append_plan.h) on the step-by-step model's state after T tokens gives exactly the
// step-by-step model's state after T + n (the same ids quantized in the same order, the same
// window), uses every appended row once, quantizes per-channel only whole groups starting at a
// group boundary, keeps the window within B (per-channel) or R (per-token), and reports the
// counts after; the state after T tokens is the rule's quantized_count(T) and kvq::quantized_tokens
// (core/footprint.h) agrees.
TEST(KiviAppendPlan, EqualsTheStepByStepRuleForEveryStateAndAppendG1To4R0To12) {
  constexpr int64_t kMaxT = 30, kMaxN = 30;
  int64_t plans = 0, quantizing = 0, topups = 0;
  for (Axis axis : {Axis::Channel, Axis::Token})
    for (int64_t g = 1; g <= 4; ++g)
      for (int64_t r = 0; r <= 12; ++r) {
        if (axis == Axis::Channel && r % g != 0) continue;  // the cache rejects it
        const AppendRule rule{axis, g, r};
        IntSpec spec;
        spec.group = static_cast<int>(g);
        spec.residual = static_cast<int>(r);
        const int64_t bound = axis == Axis::Channel ? (r > 0 ? r : g) : r;
        // states[t]: the definition's state after t tokens.
        std::vector<Model> states(1);
        for (int64_t t = 0; t < kMaxT + kMaxN; ++t) {
          states.push_back(states.back());
          step(states.back(), axis, g, r, t);
        }
        for (int64_t t = 0; t <= kMaxT; ++t) {
          const Model& before = states[static_cast<size_t>(t)];
          const int64_t q0 = static_cast<int64_t>(before.quantized.size());
          ASSERT_EQ(rule.quantized_count(t), q0) << name(axis, g, r, t, 0);
          ASSERT_EQ(quantized_tokens(spec, axis, t), q0) << name(axis, g, r, t, 0);
          for (int64_t n = 0; n <= kMaxN; ++n) {
            SCOPED_TRACE(name(axis, g, r, t, n));
            const AppendPlan p = rule.plan(t, n);
            ++plans;
            // Every appended row once: [0, topup) joins, [topup, kept_from) is quantized,
            // [kept_from, n) is kept.
            ASSERT_GE(p.topup, 0);
            ASSERT_GE(p.from_window, 0);
            ASSERT_GE(p.from_x, 0);
            ASSERT_LE(p.kept_from(), n);
            if (axis == Axis::Token) {
              EXPECT_EQ(p.topup, 0);
            }
            Model m = before;
            for (int64_t i = 0; i < p.topup; ++i) m.window.push_back(t + i);  // 1.
            ASSERT_LE(static_cast<int64_t>(m.window.size()), bound);
            ASSERT_LE(p.from_window, static_cast<int64_t>(m.window.size()));
            if (axis == Axis::Channel) {
              EXPECT_EQ(static_cast<int64_t>(m.quantized.size()) % g, 0);
              EXPECT_EQ(p.from_window % g, 0);
              EXPECT_EQ(p.from_x % g, 0);
            }
            for (int64_t i = 0; i < p.from_window; ++i) {  // 2.
              m.quantized.push_back(m.window.front());
              m.window.pop_front();
            }
            for (int64_t i = p.topup; i < p.kept_from(); ++i) m.quantized.push_back(t + i);  // 3.
            for (int64_t i = p.kept_from(); i < n; ++i) m.window.push_back(t + i);           // 4.
            ASSERT_LE(static_cast<int64_t>(m.window.size()), bound);
            const Model& after = states[static_cast<size_t>(t + n)];
            ASSERT_EQ(m.quantized, after.quantized);
            ASSERT_EQ(m.window, after.window);
            EXPECT_EQ(p.tokens, t + n);
            EXPECT_EQ(p.quantized, static_cast<int64_t>(after.quantized.size()));
            quantizing += p.quantized > q0;
            topups += p.topup > 0;
          }
        }
      }
  // The sweep reaches the interesting cases (a test that cannot fail is a defect).
  // Rules: per-channel G=1..4 with R a multiple of G in 0..12: 13 + 7 + 5 + 4; per-token 4 x 13.
  EXPECT_EQ(plans, (29 + 52) * (kMaxT + 1) * (kMaxN + 1));
  EXPECT_GT(quantizing, plans / 2);
  EXPECT_GT(topups, 0);
}

}  // namespace
}  // namespace kvq::kivi
