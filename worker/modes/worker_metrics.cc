#include "worker/modes/worker_metrics.h"

namespace pscluster::modes {
namespace {

// Runs `call`, adding its time to `clock`.
template <typename Call>
absl::Status Timed(CommClock* clock, Call call) {
  const absl::Time start = absl::Now();
  absl::Status s = call();
  clock->Add(absl::Now() - start);
  return s;
}

prometheus::Counter& Counter(prometheus::Registry* r, const std::string& name,
                             const std::string& help, const prometheus::Labels& labels = {}) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*r).Add(labels);
}

prometheus::Gauge& Gauge(prometheus::Registry* r, const std::string& name,
                         const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*r).Add({});
}

}  // namespace

absl::Status TimedParameterStore::PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                                absl::Span<const absl::Span<float>> out) {
  return Timed(clock_, [&] { return inner_->PullDenseMany(step, tables, out); });
}
absl::Status TimedParameterStore::PushPullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                                    absl::Span<const absl::Span<const float>> grads,
                                                    absl::Span<const absl::Span<float>> out) {
  return Timed(clock_, [&] { return inner_->PushPullDenseMany(step, tables, grads, out); });
}
absl::Status TimedParameterStore::ExportDense(uint32_t table_id, int64_t step,
                                              absl::Span<float> values,
                                              std::vector<absl::Span<float>> slots,
                                              int64_t* updates) {
  return Timed(clock_, [&] {
    return inner_->ExportDense(table_id, step, values, std::move(slots), updates);
  });
}
absl::Status TimedParameterStore::ImportDense(uint32_t table_id, int64_t step, int64_t updates,
                                              absl::Span<const float> values,
                                              const std::vector<absl::Span<const float>>& slots) {
  return Timed(clock_, [&] { return inner_->ImportDense(table_id, step, updates, values, slots); });
}
absl::Status TimedParameterStore::PushSparse(uint32_t table_id, int64_t step,
                                             absl::Span<const uint64_t> keys,
                                             absl::Span<const float> grads) {
  return Timed(clock_, [&] { return inner_->PushSparse(table_id, step, keys, grads); });
}
absl::Status TimedParameterStore::PullSparse(uint32_t table_id, int64_t step,
                                             absl::Span<const uint64_t> keys,
                                             absl::Span<float> out) {
  return Timed(clock_, [&] { return inner_->PullSparse(table_id, step, keys, out); });
}

absl::Status TimedCommunicator::AllReduceSum(absl::Span<float> data) {
  return Timed(clock_, [&] { return inner_->AllReduceSum(data); });
}
absl::Status TimedCommunicator::ReduceScatterSum(absl::Span<const float> in,
                                                 absl::Span<float> out) {
  return Timed(clock_, [&] { return inner_->ReduceScatterSum(in, out); });
}
absl::Status TimedCommunicator::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  return Timed(clock_, [&] { return inner_->AllGather(in, out); });
}
absl::Status TimedCommunicator::Broadcast(absl::Span<float> data, int root) {
  return Timed(clock_, [&] { return inner_->Broadcast(data, root); });
}
absl::Status TimedCommunicator::Send(absl::Span<const float> data, int peer, int tag) {
  return Timed(clock_, [&] { return inner_->Send(data, peer, tag); });
}
absl::Status TimedCommunicator::Recv(absl::Span<float> data, int peer, int tag) {
  return Timed(clock_, [&] { return inner_->Recv(data, peer, tag); });
}
absl::Status TimedCommunicator::SendRecv(absl::Span<const float> out, int to, int send_tag,
                                         absl::Span<float> in, int from, int recv_tag) {
  return Timed(clock_, [&] { return inner_->SendRecv(out, to, send_tag, in, from, recv_tag); });
}
absl::Status TimedCommunicator::Barrier() {
  return Timed(clock_, [&] { return inner_->Barrier(); });
}

WorkerMetrics::WorkerMetrics(prometheus::Registry* r)
    : steps_(Counter(r, "pscluster_worker_steps_total", "Training steps done (replays included).")),
      samples_(Counter(r, "pscluster_worker_samples_total", "Training examples processed.")),
      phase_seconds_(prometheus::BuildCounter()
                         .Name("pscluster_worker_step_phase_seconds_total")
                         .Help("Step time by phase: communication is time in PS calls and "
                               "collectives, compute the rest.")
                         .Register(*r)),
      compute_seconds_(phase_seconds_.Add({{"phase", "compute"}})),
      communication_seconds_(phase_seconds_.Add({{"phase", "communication"}})),
      step_seconds_(
          prometheus::BuildHistogram()
              .Name("pscluster_worker_step_seconds")
              .Help("Wall time of each training step.")
              .Register(*r)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025,
                                                               0.05, 0.1, 0.25, 0.5, 1, 2.5, 10})),
      loss_(Gauge(r, "pscluster_worker_loss", "Training loss of the last step.")),
      samples_per_sec_(Gauge(r, "pscluster_worker_samples_per_second",
                             "Training throughput since the start (as in the progress lines).")),
      epoch_(Gauge(r, "pscluster_worker_epoch", "The epoch being trained (1-based).")),
      test_accuracy_(Gauge(r, "pscluster_worker_test_accuracy",
                           "Test-set accuracy after the last evaluated epoch.")),
      learning_rate_(Gauge(r, "pscluster_worker_learning_rate",
                           "The optimizer's scheduled learning rate at the last step (warmup and "
                           "decay applied).")),
      mode_(prometheus::BuildGauge()
                .Name("pscluster_worker_mode")
                .Help("1 for the training mode this worker is in.")
                .Register(*r)),
      switches_(Counter(r, "pscluster_worker_mode_switches_total", "Live mode switches taken.")),
      handoff_seconds_(Gauge(r, "pscluster_worker_last_switch_handoff_seconds",
                             "Hand-over time of this worker's last mode switch.")),
      rollbacks_(Counter(r, "pscluster_worker_rollbacks_total",
                         "Rollbacks to a checkpoint after a member failed.")) {
  SetMode(coord::TRAINING_MODE_UNSPECIFIED);
}

void WorkerMetrics::Step(int64_t samples, absl::Duration compute, absl::Duration communication,
                         double loss) {
  steps_.Increment();
  samples_.Increment(static_cast<double>(samples));
  compute_seconds_.Increment(absl::ToDoubleSeconds(compute));
  communication_seconds_.Increment(absl::ToDoubleSeconds(communication));
  step_seconds_.Observe(absl::ToDoubleSeconds(compute + communication));
  loss_.Set(loss);
}

void WorkerMetrics::Progress(double samples_per_sec, int64_t epoch) {
  samples_per_sec_.Set(samples_per_sec);
  epoch_.Set(static_cast<double>(epoch));
}

void WorkerMetrics::Evaluated(double test_accuracy) { test_accuracy_.Set(test_accuracy); }

void WorkerMetrics::LearningRate(double lr) { learning_rate_.Set(lr); }

void WorkerMetrics::SetMode(coord::TrainingMode mode) {
  for (coord::TrainingMode m : coord::kTrainingModes) {
    mode_.Add({{"mode", coord::ModeName(m)}}).Set(m == mode ? 1 : 0);
  }
}

void WorkerMetrics::Switched(double handoff_seconds) {
  switches_.Increment();
  handoff_seconds_.Set(handoff_seconds);
}

void WorkerMetrics::RolledBack() { rollbacks_.Increment(); }

}  // namespace pscluster::modes
