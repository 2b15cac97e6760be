// PIPELINE: worker k of K owns layers [k*L/K, (k+1)*L/K) with their optimizer state. The
// global batch of a step (world * batch_size examples, the union of the data-parallel
// ranks' batches) is cut into M micro-batches that run in the 1F1B schedule (Narayanan et
// al. 2021 / Megatron-LM): stage k first runs K-k-1 forwards, then alternates one forward
// and one backward, then drains the remaining backwards. Activations go forward and
// gradients backward with paired send/recv (both posted before waiting, so neighbours
// never deadlock). Gradients accumulate over the micro-batches (each scaled by 1/M, so
// the sum is the gradient of the global batch's mean loss) and each stage steps at the end.
// A tensor that a layer of another stage also reads (ModelSpec::layer_reads: the GPT's head
// reads the token embedding) is held by both stages; before the step the two exchange its
// gradient and each adds the other's, so both step the same sum and the copies stay equal.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "core/tensor/non_finite.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes::internal {
namespace {

// Contiguous stages of the layers that minimise the largest stage's cost (the spec's cost
// per layer): stage s owns layers [first[s], first[s + 1]).
std::vector<int> BalancedStages(const std::vector<double>& costs, int stages) {
  const int layers = static_cast<int>(costs.size());
  std::vector<double> prefix(layers + 1, 0);
  for (int i = 0; i < layers; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[s][j]: the smallest largest-stage cost of layers [0, j) in s stages; cut[s][j]: where
  // the last of them starts.
  const double inf = 1e300;
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int j = s; j <= layers; ++j) {
      for (int i = s - 1; i < j; ++i) {
        const double cost = std::max(best[s - 1][i], prefix[j] - prefix[i]);
        if (cost < best[s][j]) best[s][j] = cost, cut[s][j] = i;
      }
    }
  }
  std::vector<int> first(stages + 1, layers);
  for (int s = stages, j = layers; s > 0; --s) j = first[s - 1] = cut[s][j];
  return first;
}

class PipelinePlacement final : public Placement {
 public:
  explicit PipelinePlacement(const PlacementContext& ctx)
      : ctx_(ctx),
        spec_(ctx.model->spec()),
        k_(ctx.rank),
        stages_(ctx.world),
        micro_(ctx.micro_batches) {}

  absl::Status Init() {
    RETURN_IF_ERROR(coord::CheckModeFits(coord::PIPELINE, ModeLimitsOf(spec_), stages_));
    const int layers = spec_.num_layers();
    const int global = ctx_.world * ctx_.batch_size;
    if (micro_ < 1 || global % micro_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--micro_batches=", micro_, " must divide the global batch of ", global, " examples"));
    }
    rows_ = global / micro_;
    first_of_ = BalancedStages(spec_.layer_costs, stages_);
    model::InstanceOptions stage = model::WholeModel(rows_);
    stage.first_layer = first_of_[k_];
    stage.end_layer = first_of_[k_ + 1];
    stage.slots = std::min(micro_, stages_ - k_);  // micro-batches in flight on this stage
    ASSIGN_OR_RETURN(model_, NewModel(ctx_, stage));
    for (int l = 0; l < layers; ++l) {
      for (int i : spec_.layer_params[l]) layer_of_[i] = l;
    }
    for (size_t local = 0; local < model_->params().size(); ++local) {
      const int i = model_->params()[local].index;
      local_of_[i] = static_cast<int>(local);
      if (StageOf(layer_of_.at(i)) != k_) tied_.push_back({i, StageOf(layer_of_.at(i))});
    }
    for (size_t l = 0; l < spec_.layer_reads.size(); ++l) {
      for (int i : spec_.layer_reads[l]) {
        const int reader = StageOf(static_cast<int>(l)), owner = StageOf(layer_of_.at(i));
        if (owner == k_ && reader != k_) tied_.push_back({i, reader});
      }
    }
    std::sort(tied_.begin(), tied_.end());  // the same order on both sides of each pair
    tied_.erase(std::unique(tied_.begin(), tied_.end()), tied_.end());
    // One rank's view of the whole global batch: the data-parallel ranks' batches in order.
    ASSIGN_OR_RETURN(auto batches,
                     data::BatchIterator::Create(ctx_.train, 0, 1, global, ctx_.seed));
    batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    in_.resize(static_cast<size_t>(rows_) * model_->input_width());
    dx_.resize(in_.size());
    out_.resize(static_cast<size_t>(rows_) * model_->output_width());
    dout_.resize(out_.size());
    return absl::OkStatus();
  }

  Mode mode() const override { return coord::PIPELINE; }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(CheckState(state, spec_, ctx_.optimizer));
    params_.clear();
    slots_.clear();
    for (const model::Model::Param& p : model_->params()) {  // this stage's tensors, in order
      params_.push_back(state.params[p.index]);
      slots_.push_back(state.slots[p.index]);
      model_->SetParam(params_.size() - 1, params_.back().data());
    }
    updates_ = state.updates;
    return absl::OkStatus();
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    ModelState state;
    state.updates = updates_;
    for (size_t i = 0; i < spec_.params.size(); ++i) {  // each broadcast by the owning stage
      const int owner = StageOf(layer_of_.at(i));
      const bool mine = owner == k_;
      const int local = mine ? local_of_.at(i) : -1;
      std::vector<float> p = mine ? params_[local] : std::vector<float>(spec_.params[i].size());
      RETURN_IF_ERROR(ctx_.comm->Broadcast(absl::MakeSpan(p), owner));
      state.params.push_back(std::move(p));
      std::vector<std::vector<float>> slots(with_slots ? ctx_.optimizer->num_slots() : 0);
      for (size_t s = 0; s < slots.size(); ++s) {
        slots[s] = mine ? slots_[local][s] : std::vector<float>(state.params.back().size());
        RETURN_IF_ERROR(ctx_.comm->Broadcast(absl::MakeSpan(slots[s]), owner));
      }
      state.slots.push_back(std::move(slots));
    }
    return state;
  }

  absl::StatusOr<float> Step(int64_t step) override {
    const absl::Time start = absl::Now();
    if (first() || last()) BatchAt(batches_.get(), step, &batch_);
    model_->ZeroGrads();
    loss_ = 0;
    // 1F1B (Megatron-LM's schedule without interleaving).
    const int warmup = std::min(stages_ - k_ - 1, micro_), steady = micro_ - warmup;
    for (int m = 0; m < warmup; ++m) {
      RETURN_IF_ERROR(Exchange(nullptr, kNone, 0, kForward, m));
      RETURN_IF_ERROR(Forward(m));
      RETURN_IF_ERROR(Exchange(&out_, kForward, m, kNone, 0));
    }
    if (steady > 0) RETURN_IF_ERROR(Exchange(nullptr, kNone, 0, kForward, warmup));
    for (int i = 0; i < steady; ++i) {
      const int mf = warmup + i;
      RETURN_IF_ERROR(Forward(mf));
      RETURN_IF_ERROR(Exchange(&out_, kForward, mf, kBackward, i));  // out, gradient of i back
      RETURN_IF_ERROR(Backward(i));
      if (i + 1 == steady) {
        RETURN_IF_ERROR(Exchange(&dx_, kBackward, i, kNone, 0));
      } else {
        RETURN_IF_ERROR(Exchange(&dx_, kBackward, i, kForward, mf + 1));  // dx, next input
      }
    }
    for (int m = steady; m < micro_; ++m) {
      RETURN_IF_ERROR(Exchange(nullptr, kNone, 0, kBackward, m));
      RETURN_IF_ERROR(Backward(m));
      RETURN_IF_ERROR(Exchange(&dx_, kBackward, m, kNone, 0));
    }
    // Every stage reports the global batch's loss, which only the last stage computed; like
    // every message of the step, before any update, so that a failure leaves the stage as it was.
    float loss = static_cast<float>(loss_);
    RETURN_IF_ERROR(
        Waited([&] { return ctx_.comm->Broadcast(absl::MakeSpan(&loss, 1), stages_ - 1); }));
    const absl::Time update_start = absl::Now();
    const absl::Duration waited_before = wait_time_;
    std::vector<std::vector<float>> grads(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      grads[i].resize(params_[i].size());
      model_->GetGrad(i, grads[i].data());
    }
    RETURN_IF_ERROR(SumTiedGradients(&grads));
    ++updates_;
    for (size_t i = 0; i < params_.size(); ++i) {
      std::vector<float>& grad = grads[i];
      ApplyOptimizer(*ctx_.optimizer, params_[i].data(), grad.data(), slots_[i], params_[i].size(),
                     updates_);
      model_->SetParam(i, params_[i].data());
    }
    const absl::Time end = absl::Now();
    update_time_ += end - update_start - (wait_time_ - waited_before);  // the tied sum waited
    step_time_ += end - start;
    ++steps_;
    return loss;
  }

  std::vector<std::pair<std::string, double>> Figures() const override {
    const double step = absl::ToDoubleSeconds(step_time_);
    // Mean milliseconds of this stage's compute: a micro-batch's forward and backward, and a
    // step's update (gradients out, the optimizer). Stages whose forward + backward differ
    // wait for the slowest at every micro-batch; see bench/pipeline_bubble for the schedule
    // these times allow.
    auto per = [](absl::Duration d, int64_t n) {
      return n > 0 ? absl::ToDoubleMilliseconds(d) / static_cast<double>(n) : 0.0;
    };
    return {{"pipeline_stages", static_cast<double>(stages_)},
            {"pipeline_micro_batches", static_cast<double>(micro_)},
            // Idle share of this stage's step time: in messages, waiting on its neighbours.
            {"pipeline_bubble", step > 0 ? absl::ToDoubleSeconds(wait_time_) / step : 0},
            {"pipeline_bubble_ideal", static_cast<double>(stages_ - 1) / (micro_ + stages_ - 1)},
            {"pipeline_step_ms", per(step_time_, steps_)},
            {"pipeline_forward_ms", per(forward_time_, steps_ * micro_)},
            {"pipeline_backward_ms", per(backward_time_, steps_ * micro_)},
            {"pipeline_update_ms", per(update_time_, steps_)}};
  }

 private:
  enum Direction { kNone, kForward, kBackward };

  int StageOf(int layer) const {
    return static_cast<int>(std::upper_bound(first_of_.begin(), first_of_.end(), layer) -
                            first_of_.begin() - 1);
  }

  // Each tied tensor's gradient exchanged with the other stage holding it; both add the
  // other's (a + b == b + a: the copies stay bitwise equal).
  absl::Status SumTiedGradients(std::vector<std::vector<float>>* grads) {
    std::vector<float> theirs;
    for (const auto& [index, peer] : tied_) {
      std::vector<float>& mine = (*grads)[local_of_.at(index)];
      theirs.resize(mine.size());
      const int tag = kTiedTag + index;
      RETURN_IF_ERROR(Waited(
          [&] { return ctx_.comm->SendRecv(mine, peer, tag, absl::MakeSpan(theirs), peer, tag); }));
      core::AddAndMaxAbs(absl::MakeSpan(mine), theirs);  // one vector pass; the max unused
    }
    return absl::OkStatus();
  }

  bool first() const { return k_ == 0; }
  bool last() const { return k_ + 1 == stages_; }
  int slot(int m) const { return m % std::min(micro_, stages_ - k_); }

  // Posts the send of micro-batch sm (kForward: its output to the next stage; kBackward:
  // its input gradient to the previous one) and the receive for micro-batch rm (kForward:
  // its input; kBackward: its output gradient) together. A side whose neighbour does not
  // exist (the first/last stage) is dropped.
  absl::Status Exchange(const std::vector<float>* send, Direction send_dir, int sm,
                        Direction recv_dir, int rm) {
    const bool do_send = send_dir != kNone && (send_dir == kForward ? !last() : !first());
    const bool do_recv = recv_dir == kForward ? !first() : (recv_dir == kBackward && !last());
    const int to = send_dir == kForward ? k_ + 1 : k_ - 1;
    const int from = recv_dir == kForward ? k_ - 1 : k_ + 1;
    const int send_tag = 2 * sm + (send_dir == kBackward),
              recv_tag = 2 * rm + (recv_dir == kBackward);
    std::vector<float>& in = recv_dir == kForward ? in_ : dout_;
    return Waited([&] {
      if (do_send && do_recv) {
        return ctx_.comm->SendRecv(*send, to, send_tag, absl::MakeSpan(in), from, recv_tag);
      }
      if (do_send) return ctx_.comm->Send(*send, to, send_tag);
      if (do_recv) return ctx_.comm->Recv(absl::MakeSpan(in), from, recv_tag);
      return absl::OkStatus();
    });
  }

  // Runs a message exchange, its time counted as waiting.
  template <typename Fn>
  absl::Status Waited(Fn fn) {
    const absl::Time t0 = absl::Now();
    absl::Status s = fn();
    wait_time_ += absl::Now() - t0;
    return s;
  }

  absl::Status Forward(int m) {
    const float* x =
        first() ? batch_.x.data() + static_cast<size_t>(m) * rows_ * spec_.input_width : in_.data();
    const absl::Time t0 = absl::Now();
    absl::Status s = model_->StageForward(slot(m), x, rows_, out_.data());
    forward_time_ += absl::Now() - t0;
    return s;
  }

  absl::Status Backward(int m) {
    const int32_t* labels =
        last() ? batch_.y.data() + static_cast<size_t>(m) * rows_ * spec_.label_width : nullptr;
    const absl::Time t0 = absl::Now();
    ASSIGN_OR_RETURN(model::StepResult r,
                     model_->StageBackward(slot(m), labels, last() ? nullptr : dout_.data(), rows_,
                                           1.0f / micro_, dx_.data()));
    backward_time_ += absl::Now() - t0;
    loss_ += r.loss / micro_;
    return absl::OkStatus();
  }

  const PlacementContext ctx_;
  const model::ModelSpec& spec_;
  const int k_, stages_, micro_;
  int rows_ = 0;                            // examples per micro-batch
  std::vector<int> first_of_;               // stage s owns layers [first_of_[s], first_of_[s + 1])
  static constexpr int kTiedTag = 1 << 20;  // above every micro-batch's tags
  std::map<int, int> layer_of_;             // tensor index -> its layer
  std::map<int, int> local_of_;             // tensor index -> this stage's index of it, if held
  std::vector<std::pair<int, int>> tied_;   // (tensor index, the other stage holding it)
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  std::vector<std::vector<float>> params_;              // this stage's tensors
  std::vector<std::vector<std::vector<float>>> slots_;  // and their optimizer slots
  std::vector<float> in_, dx_, out_, dout_;             // one micro-batch each
  int64_t updates_ = 0;
  double loss_ = 0;
  // Over every step: in messages, in all, and this stage's compute (forward, backward, update).
  absl::Duration wait_time_, step_time_, forward_time_, backward_time_, update_time_;
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Placement>> MakePipelinePlacement(const PlacementContext& ctx) {
  if (ctx.comm == nullptr || ctx.optimizer == nullptr || ctx.model == nullptr) {
    return absl::FailedPreconditionError(
        "pipeline mode needs a communicator, an optimizer and a model");
  }
  auto p = std::make_unique<PipelinePlacement>(ctx);
  RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<Placement>(std::move(p));
}

}  // namespace pscluster::modes::internal
