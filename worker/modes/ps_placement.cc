// PS: the shards hold the state; every step pulls the dense tensors (the last step's
// push brought them) and the embedding rows the batch touches, computes, and pushes the
// dense gradients and those rows' gradients. The shards sum the workers' gradients, so
// each worker pushes 1/world of its own.
//
// With overlap_push (SSP with staleness >= 1, ASP) the dense push/pull of step S runs on a
// communication thread while step S+1 computes on the parameters step S-1's push/pull
// brought: those lack at most the updates of step S, which is what a pull at step S+1 may
// lack under SSP(1). Step S+1 waits for step S's push/pull after its backward pass, puts
// its parameters into the model and posts its own: one push/pull in flight at a time, the
// step as long as the longer of compute and round trip instead of their sum.
#include "common/concurrent.h"
#include "common/status_macros.h"
#include "core/tensor/scale.h"
#include "worker/modes/comm_thread.h"
#include "worker/modes/model_tables.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes::internal {
namespace {

class PsPlacement final : public Placement {
 public:
  explicit PsPlacement(const PlacementContext& ctx)
      : ctx_(ctx), spec_(ctx.model->spec()), tables_(spec_) {}

  absl::Status Init() {
    ASSIGN_OR_RETURN(model_, NewModel(ctx_, model::WholeModel(ctx_.batch_size)));
    ASSIGN_OR_RETURN(auto batches, DataParallelBatches(ctx_));
    batches_ = std::make_unique<data::BatchIterator>(std::move(batches));
    for (const auto& param : model_->params()) host_.emplace_back(param.size);
    dense_ids_ = tables_.dense_ids();
    if (ctx_.overlap_push) comm_ = std::make_unique<CommThread>();
    return absl::OkStatus();
  }

  Mode mode() const override { return coord::PS; }

  absl::Status Load(const ModelState& state, int64_t step) override {
    RETURN_IF_ERROR(CheckState(state, spec_, nullptr));
    Drain().IgnoreError();  // the state before `step` replaces what it would have brought
    pulled_ = -1;
    if (ctx_.rank == 0) {  // one writer; the tables then stand at `step`
      RETURN_IF_ERROR(ImportState(ctx_.ps, spec_, state, step));
      if (ctx_.after_import) ctx_.after_import();
    }
    // Nobody pulls step `step` before the import landed.
    return ctx_.comm != nullptr ? ctx_.comm->Barrier() : absl::OkStatus();
  }

  absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) override {
    RETURN_IF_ERROR(Drain());
    if (with_slots) return GatherWithSlots(step);
    ModelState state;  // a pull at `step` (BSP: waits until the step is applied)
    state.slots.resize(host_.size());
    if (pulled_ != step) RETURN_IF_ERROR(Pull(step));
    state.params = host_;
    for (size_t e = 0; e < spec_.embeddings.size(); ++e) {  // every row (created if new)
      const std::vector<uint64_t> keys = AllIds(spec_.embeddings[e]);
      RowsState rows;
      rows.values.resize(keys.size() * spec_.embeddings[e].dim);
      RETURN_IF_ERROR(
          ctx_.ps->PullSparse(tables_.sparse(e), step, keys, absl::MakeSpan(rows.values)));
      // (row update counts are not known without an export: left empty)
      state.embeddings.push_back(std::move(rows));
    }
    return state;
  }

  absl::Status Flush() override { return Drain(); }

  absl::StatusOr<float> Step(int64_t step) override {
    if (in_flight_ >= 0 && in_flight_ != step - 1) RETURN_IF_ERROR(Drain());
    // Else the last push brought them, or (overlap) the one before it did.
    if (in_flight_ < 0 && pulled_ != step) RETURN_IF_ERROR(Pull(step));
    BatchAt(batches_.get(), step, &batch_);
    std::vector<std::vector<uint64_t>> keys(spec_.embeddings.size());
    for (size_t e = 0; e < keys.size(); ++e) {
      keys[e] = model_->Keys(e, batch_.x.data(), batch_.size);
      RETURN_IF_ERROR(PullRows(e, step, keys[e]));
    }
    ASSIGN_OR_RETURN(model::StepResult r,
                     model_->ForwardBackward(batch_.x.data(), batch_.y.data(), batch_.size));
    const float scale = 1.0f / ctx_.world;
    for (size_t e = 0; e < keys.size(); ++e) RETURN_IF_ERROR(PushRows(e, step, keys[e], scale));
    RETURN_IF_ERROR(Drain());  // host_ is the in-flight push/pull's until it is done
    std::vector<absl::Span<const float>> grads;
    std::vector<absl::Span<float>> next;
    for (size_t i = 0; i < host_.size(); ++i) {
      model_->GetGrad(i, host_[i].data());
      core::Scale(absl::MakeSpan(host_[i]), scale);
      grads.emplace_back(host_[i]);
      next.emplace_back(absl::MakeSpan(host_[i]));
    }
    // One round trip per shard: this step's gradients out, the next step's parameters back.
    pulled_ = -1;
    auto push_pull = [this, step, grads = std::move(grads), next = std::move(next)] {
      return ctx_.ps->PushPullDenseMany(step, dense_ids_, grads, next);
    };
    if (comm_ == nullptr) {
      RETURN_IF_ERROR(push_pull());
      SetParams(step + 1);
    } else {
      comm_->Post(std::move(push_pull));
      in_flight_ = step;
    }
    return r.loss;
  }

 private:
  // Leaving PS mode: the whole state, exported by every rank from the shards.
  absl::StatusOr<ModelState> GatherWithSlots(int64_t step) {
    if (!spec_.embeddings.empty()) {
      return absl::UnimplementedError(
          "leaving ps mode with embedding tables: the shards cannot export sparse tables yet");
    }
    ModelState state;
    state.slots.resize(host_.size());
    for (const auto& h : host_) state.params.emplace_back(h.size());
    std::vector<int64_t> updates(host_.size());
    RETURN_IF_ERROR(RunConcurrently(host_.size(), [&](int i) -> absl::Status {
      // The tables were created with this optimizer (a shard with another refuses the export).
      state.slots[i].assign(ctx_.optimizer->num_slots(), std::vector<float>(host_[i].size()));
      std::vector<absl::Span<float>> slots;
      for (auto& s : state.slots[i]) slots.emplace_back(absl::MakeSpan(s));
      return ctx_.ps->ExportDense(tables_.dense(i), step, absl::MakeSpan(state.params[i]), slots,
                                  &updates[i]);
    }));
    state.updates = updates[0];
    return state;
  }

  absl::Status Pull(int64_t step) {
    std::vector<absl::Span<float>> out;
    for (auto& h : host_) out.emplace_back(absl::MakeSpan(h));
    RETURN_IF_ERROR(ctx_.ps->PullDenseMany(step, dense_ids_, out));  // one RPC per shard
    SetParams(step);
    return absl::OkStatus();
  }

  // host_ holds the parameters of `step` (pulled or brought by a push/pull): into the model.
  void SetParams(int64_t step) {
    for (size_t i = 0; i < host_.size(); ++i) model_->SetParam(i, host_[i].data());
    pulled_ = step;
  }

  // Waits for the push/pull in flight, if any (bounded by the client's deadline), and puts
  // the parameters it brought into the model; on an error the model keeps the older ones
  // and the next step pulls.
  absl::Status Drain() {
    if (in_flight_ < 0) return absl::OkStatus();
    const int64_t step = in_flight_;
    in_flight_ = -1;
    RETURN_IF_ERROR(comm_->Wait());
    SetParams(step + 1);
    return absl::OkStatus();
  }

  absl::Status PullRows(int e, int64_t step, const std::vector<uint64_t>& keys) {
    rows_.resize(keys.size() * spec_.embeddings[e].dim);
    RETURN_IF_ERROR(ctx_.ps->PullSparse(tables_.sparse(e), step, keys, absl::MakeSpan(rows_)));
    return model_->SetRows(e, keys, rows_);
  }

  absl::Status PushRows(int e, int64_t step, const std::vector<uint64_t>& keys, float scale) {
    rows_.resize(keys.size() * spec_.embeddings[e].dim);
    model_->GetRowGrads(e, absl::MakeSpan(rows_));
    core::Scale(absl::MakeSpan(rows_), scale);
    return ctx_.ps->PushSparse(tables_.sparse(e), step, keys, rows_);
  }

  const PlacementContext ctx_;
  const model::ModelSpec& spec_;
  const ModelTables tables_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::Batch batch_;
  std::vector<std::vector<float>> host_;  // per parameter: pulled values, then gradients
  std::vector<uint32_t> dense_ids_;       // the parameters' table ids
  std::vector<float> rows_;               // one embedding table's rows or row gradients
  int64_t pulled_ = -1;     // the step whose parameters the model holds (-1: none known)
  int64_t in_flight_ = -1;  // overlap_push: the step whose push/pull comm_ runs (-1: none)
  std::unique_ptr<CommThread> comm_;  // overlap_push; last: stopped first
};

}  // namespace

absl::StatusOr<std::unique_ptr<Placement>> MakePsPlacement(const PlacementContext& ctx) {
  if (ctx.ps == nullptr || ctx.optimizer == nullptr || ctx.model == nullptr) {
    return absl::FailedPreconditionError(
        "ps mode needs parameter-server shards, the tables' optimizer and a model");
  }
  auto p = std::make_unique<PsPlacement>(ctx);
  RETURN_IF_ERROR(p->Init());
  return std::unique_ptr<Placement>(std::move(p));
}

}  // namespace pscluster::modes::internal
