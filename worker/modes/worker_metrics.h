// What a worker reports to Prometheus (ps_worker --metrics_port): steps and samples, step
// time split into compute and communication, loss, test accuracy, throughput, the mode,
// switches with their hand-over time, and rollbacks.
//
// Communication is the time the training thread spends inside ParameterStore calls and
// collectives; TimedParameterStore and TimedCommunicator wrap the real ones to measure it.
// Compute is the rest of the step (forward, backward, local optimizer, copies).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "client/ps/parameter_store.h"
#include "common/training_mode.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/collective/communicator.h"

namespace pscluster::modes {

// Time spent in communication so far (thread-safe).
class CommClock {
 public:
  absl::Duration total() const { return absl::Nanoseconds(nanos_.load(std::memory_order_relaxed)); }
  void Add(absl::Duration d) {
    nanos_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> nanos_{0};
};

class TimedParameterStore final : public ParameterStore {
 public:
  TimedParameterStore(ParameterStore* inner, CommClock* clock) : inner_(inner), clock_(clock) {}
  absl::Status PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                             absl::Span<const absl::Span<float>> out) override;
  absl::Status PushPullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                 absl::Span<const absl::Span<const float>> grads,
                                 absl::Span<const absl::Span<float>> out) override;
  absl::Status ExportDense(uint32_t table_id, int64_t step, absl::Span<float> values,
                           std::vector<absl::Span<float>> slots, int64_t* updates) override;
  absl::Status ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                           absl::Span<const float> values,
                           const std::vector<absl::Span<const float>>& slots) override;
  absl::Status PushSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                          absl::Span<const float> grads) override;
  absl::Status PullSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                          absl::Span<float> out) override;

 private:
  ParameterStore* const inner_;
  CommClock* const clock_;
};

class TimedCommunicator final : public collective::Communicator {
 public:
  TimedCommunicator(std::unique_ptr<collective::Communicator> inner, CommClock* clock)
      : inner_(std::move(inner)), clock_(clock) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status ReduceScatterSum(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<float> data, int root) override;
  absl::Status Send(absl::Span<const float> data, int peer, int tag) override;
  absl::Status Recv(absl::Span<float> data, int peer, int tag) override;
  absl::Status SendRecv(absl::Span<const float> out, int to, int send_tag, absl::Span<float> in,
                        int from, int recv_tag) override;
  absl::Status Barrier() override;

 private:
  const std::unique_ptr<collective::Communicator> inner_;
  CommClock* const clock_;
};

class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry* registry);

  void Step(int64_t samples, absl::Duration compute, absl::Duration communication, double loss);
  void Progress(double samples_per_sec, int64_t epoch);
  void Evaluated(double test_accuracy);
  void LearningRate(double lr);
  void SetMode(coord::TrainingMode mode);
  void Switched(double handoff_seconds);
  void RolledBack();

 private:
  prometheus::Counter& steps_;
  prometheus::Counter& samples_;
  prometheus::Family<prometheus::Counter>& phase_seconds_;
  prometheus::Counter& compute_seconds_;
  prometheus::Counter& communication_seconds_;
  prometheus::Histogram& step_seconds_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& samples_per_sec_;
  prometheus::Gauge& epoch_;
  prometheus::Gauge& test_accuracy_;
  prometheus::Gauge& learning_rate_;
  prometheus::Family<prometheus::Gauge>& mode_;
  prometheus::Counter& switches_;
  prometheus::Gauge& handoff_seconds_;
  prometheus::Counter& rollbacks_;
};

}  // namespace pscluster::modes
