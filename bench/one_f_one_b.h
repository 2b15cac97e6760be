// The 1F1B schedule (worker/modes/pipeline_placement.cc) played out with given stage times
// and free messages: what bubble the stages' own compute leaves, before any cost of the
// messages. With equal stages (each F + B the same, no update) it is (K-1)/(M+K-1); stages
// whose times differ wait for the slowest at every micro-batch, and a longer update on one
// stage delays the next step's first forward for the others.
#pragma once

#include <algorithm>
#include <vector>

namespace pscluster::bench {

struct StageTimes {
  double forward = 0, backward = 0;  // per micro-batch
  double update = 0;                 // per step, after the loss broadcast
};

// Each stage's bubble (share of its step not computing) in the last of `steps` steps of M
// micro-batches, in the placement's order: K-k-1 warm-up forwards, one forward and one
// backward alternating, the remaining backwards, the last stage's loss broadcast (the others
// wait for it), the update.
inline std::vector<double> OneFOneBBubble(const std::vector<StageTimes>& stages, int micro,
                                          int steps) {
  const int k_count = static_cast<int>(stages.size());
  struct Op {
    enum { kForward, kBackward, kBroadcast, kUpdate } kind;
    int m;
  };
  std::vector<std::vector<Op>> ops(k_count);  // one step's, per stage
  for (int k = 0; k < k_count; ++k) {
    const int warmup = std::min(k_count - k - 1, micro), steady = micro - warmup;
    for (int m = 0; m < warmup; ++m) ops[k].push_back({Op::kForward, m});
    for (int i = 0; i < steady; ++i) {
      ops[k].push_back({Op::kForward, warmup + i});
      ops[k].push_back({Op::kBackward, i});
    }
    for (int m = steady; m < micro; ++m) ops[k].push_back({Op::kBackward, m});
    ops[k].push_back({Op::kBroadcast, 0});
    ops[k].push_back({Op::kUpdate, 0});
  }
  const double kNotYet = -1;
  std::vector<double> clock(k_count, 0), start = clock;  // start: of the step being played
  for (int step = 0; step < steps; ++step) {
    // When each stage's forward / backward of each micro-batch ended; the root's broadcast.
    std::vector<std::vector<double>> f_end(k_count, std::vector<double>(micro, kNotYet));
    std::vector<std::vector<double>> b_end = f_end;
    double root_at = kNotYet;
    std::vector<size_t> next(k_count, 0);
    start = clock;
    for (bool moved = true; moved;) {
      moved = false;
      for (int k = 0; k < k_count; ++k) {
        while (next[k] < ops[k].size()) {
          const Op& op = ops[k][next[k]];
          double ready = clock[k], work = 0;
          if (op.kind == Op::kForward) {
            if (k > 0 && f_end[k - 1][op.m] == kNotYet) break;
            if (k > 0) ready = std::max(ready, f_end[k - 1][op.m]);
            work = stages[k].forward;
          } else if (op.kind == Op::kBackward) {
            if (k + 1 < k_count && b_end[k + 1][op.m] == kNotYet) break;
            if (k + 1 < k_count) ready = std::max(ready, b_end[k + 1][op.m]);
            work = stages[k].backward;
          } else if (op.kind == Op::kBroadcast) {
            if (k + 1 == k_count) {
              root_at = clock[k];
            } else {
              if (root_at == kNotYet) break;
              ready = std::max(ready, root_at);
            }
          } else {
            work = stages[k].update;
          }
          clock[k] = ready + work;
          if (op.kind == Op::kForward) f_end[k][op.m] = clock[k];
          if (op.kind == Op::kBackward) b_end[k][op.m] = clock[k];
          ++next[k];
          moved = true;
        }
      }
    }
  }
  std::vector<double> bubble(k_count, 0);  // the last step's
  for (int k = 0; k < k_count; ++k) {
    const double took = clock[k] - start[k];
    const double busy = micro * (stages[k].forward + stages[k].backward) + stages[k].update;
    bubble[k] = took > 0 ? (took - busy) / took : 0;
  }
  return bubble;
}

}  // namespace pscluster::bench
