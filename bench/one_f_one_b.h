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

namespace one_f_one_b_internal {

struct Op {
  enum { kForward, kBackward, kBroadcast, kUpdate } kind;
  int m;  // the micro-batch
};

// One step's ops per stage, in the placement's order: K-k-1 warm-up forwards, one forward
// and one backward alternating, the remaining backwards, the loss broadcast, the update.
inline std::vector<std::vector<Op>> Schedule(int k_count, int micro) {
  std::vector<std::vector<Op>> ops(k_count);
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
  return ops;
}

// One step played from each stage's `clock`: every stage runs its ops in order, each once
// what it needs has ended (the previous stage's forward, the next one's backward, the last
// stage's broadcast).
class StepPlay {
 public:
  StepPlay(const std::vector<StageTimes>& stages, const std::vector<std::vector<Op>>& ops,
           int micro, std::vector<double>* clock)
      : stages_(stages),
        ops_(ops),
        clock_(*clock),
        f_end_(stages.size(), std::vector<double>(micro, kNotYet)),
        b_end_(f_end_),
        next_(stages.size(), 0) {}
  void Run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int k = 0; k < static_cast<int>(stages_.size()); ++k) {
        while (next_[k] < ops_[k].size() && Try(k, ops_[k][next_[k]])) {
          ++next_[k];
          moved = true;
        }
      }
    }
  }

 private:
  static constexpr double kNotYet = -1;
  // Runs op on stage k if what it needs has ended; false if it must wait.
  bool Try(int k, const Op& op) {
    const int last = static_cast<int>(stages_.size()) - 1;
    double ready = clock_[k], work = 0;
    if (op.kind == Op::kForward) {
      if (k > 0 && f_end_[k - 1][op.m] == kNotYet) return false;
      if (k > 0) ready = std::max(ready, f_end_[k - 1][op.m]);
      work = stages_[k].forward;
    } else if (op.kind == Op::kBackward) {
      if (k < last && b_end_[k + 1][op.m] == kNotYet) return false;
      if (k < last) ready = std::max(ready, b_end_[k + 1][op.m]);
      work = stages_[k].backward;
    } else if (op.kind == Op::kBroadcast) {
      if (k == last) {
        root_at_ = clock_[k];
      } else {
        if (root_at_ == kNotYet) return false;
        ready = std::max(ready, root_at_);
      }
    } else {
      work = stages_[k].update;
    }
    clock_[k] = ready + work;
    if (op.kind == Op::kForward) f_end_[k][op.m] = clock_[k];
    if (op.kind == Op::kBackward) b_end_[k][op.m] = clock_[k];
    return true;
  }

  const std::vector<StageTimes>& stages_;
  const std::vector<std::vector<Op>>& ops_;
  std::vector<double>& clock_;
  // When each stage's forward / backward of each micro-batch ended; the root's broadcast.
  std::vector<std::vector<double>> f_end_, b_end_;
  double root_at_ = kNotYet;
  std::vector<size_t> next_;
};

}  // namespace one_f_one_b_internal

// Each stage's bubble (share of its step not computing) in the last of `steps` steps of M
// micro-batches, in the placement's order: K-k-1 warm-up forwards, one forward and one
// backward alternating, the remaining backwards, the last stage's loss broadcast (the others
// wait for it), the update.
inline std::vector<double> OneFOneBBubble(const std::vector<StageTimes>& stages, int micro,
                                          int steps) {
  using namespace one_f_one_b_internal;
  const int k_count = static_cast<int>(stages.size());
  const std::vector<std::vector<Op>> ops = Schedule(k_count, micro);
  std::vector<double> clock(k_count, 0), start = clock;  // start: of the step being played
  for (int step = 0; step < steps; ++step) {
    start = clock;
    StepPlay(stages, ops, micro, &clock).Run();
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
