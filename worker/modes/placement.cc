// What every placement shares, and the choice among them.
#include "worker/modes/placement.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/concurrent.h"
#include "common/status_macros.h"
#include "core/init/initializer.h"
#include "worker/modes/model_tables.h"
#include "worker/modes/placement_internal.h"

namespace pscluster::modes {

ModelState InitialState(const model::ModelSpec& spec, const core::Optimizer& opt) {
  ModelState state;
  for (const model::TensorSpec& t : spec.params) {
    std::vector<float> values(t.size());
    core::InitDense(t.init, 0, absl::MakeSpan(values));
    std::vector<std::vector<float>> slots;
    for (int k = 0; k < opt.num_slots(); ++k) {
      slots.emplace_back(values.size(), opt.slot_initial_value(k));
    }
    state.params.push_back(std::move(values));
    state.slots.push_back(std::move(slots));
  }
  for (const model::EmbeddingSpec& e : spec.embeddings) {
    RowsState rows;
    rows.values.resize(e.vocab * e.dim);
    for (uint64_t id = 0; id < e.vocab; ++id) {
      core::InitSparseRow(e.init, id, absl::MakeSpan(rows.values.data() + id * e.dim, e.dim));
    }
    for (int k = 0; k < opt.num_slots(); ++k) {
      rows.slots.emplace_back(rows.values.size(), opt.slot_initial_value(k));
    }
    rows.updates.assign(e.vocab, 0);
    state.embeddings.push_back(std::move(rows));
  }
  return state;
}

coord::ModeLimits ModeLimitsOf(const model::ModelSpec& spec) {
  coord::ModeLimits limits;
  limits.set_model(spec.kind);
  limits.set_layers(spec.num_layers());
  const bool tensor_form = !spec.splits.empty() && spec.splits.size() == spec.params.size();
  limits.set_max_tensor_parallel(tensor_form ? spec.max_tensor_parallel : 0);
  limits.set_embedding_tables(!spec.embeddings.empty());
  return limits;
}

std::vector<uint64_t> AllIds(const model::EmbeddingSpec& table) {
  std::vector<uint64_t> ids(table.vocab);
  for (uint64_t k = 0; k < ids.size(); ++k) ids[k] = k;
  return ids;
}

absl::Status SetWholeState(model::Model* model, const model::ModelSpec& spec,
                           const ModelState& state) {
  for (size_t i = 0; i < state.params.size(); ++i) model->SetParam(i, state.params[i].data());
  for (size_t e = 0; e < state.embeddings.size(); ++e) {
    RETURN_IF_ERROR(model->SetRows(e, AllIds(spec.embeddings[e]), state.embeddings[e].values));
  }
  return absl::OkStatus();
}

bool EmbeddingsUntouched(const ModelState& state) {
  for (const RowsState& rows : state.embeddings) {
    for (int64_t u : rows.updates) {
      if (u != 0) return false;
    }
  }
  return true;
}

absl::Status ImportState(ParameterStore* ps, const model::ModelSpec& spec, const ModelState& state,
                         int64_t step) {
  if (!EmbeddingsUntouched(state)) {
    return absl::UnimplementedError(
        "writing trained embedding rows into the shards: the shards cannot import sparse tables "
        "yet (train models with embedding tables in ps mode, or without checkpoints)");
  }
  const ModelTables tables(spec);
  return RunConcurrently(state.params.size(), [&](int i) {
    std::vector<absl::Span<const float>> slots;
    for (const auto& s : state.slots[i]) slots.emplace_back(s);
    return ps->ImportDense(tables.dense(i), step, state.updates, state.params[i], slots);
  });
}

namespace internal {

absl::Status CheckState(const ModelState& state, const model::ModelSpec& spec,
                        const core::Optimizer* opt) {
  const size_t params = spec.params.size();
  if (state.params.size() != params || state.slots.size() != params) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state holds ", state.params.size(), " tensors, the model ", params));
  }
  for (size_t i = 0; i < params; ++i) {
    const size_t n = spec.params[i].size();
    if (state.params[i].size() != n) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.params[i].name, " holds ",
                                                     state.params[i].size(), " floats, not ", n));
    }
    if (opt != nullptr && state.slots[i].size() != static_cast<size_t>(opt->num_slots())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", spec.params[i].name, " has ", state.slots[i].size(),
                       " optimizer slots, the optimizer ", opt->num_slots()));
    }
  }
  if (state.embeddings.size() != spec.embeddings.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the state holds ", state.embeddings.size(),
                                                   " embedding tables, the model ",
                                                   spec.embeddings.size()));
  }
  for (size_t e = 0; e < spec.embeddings.size(); ++e) {
    const RowsState& rows = state.embeddings[e];
    const size_t n = spec.embeddings[e].vocab * spec.embeddings[e].dim;
    if (rows.values.size() != n || rows.updates.size() != spec.embeddings[e].vocab ||
        (opt != nullptr && rows.slots.size() != static_cast<size_t>(opt->num_slots()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding table ", spec.embeddings[e].name, " holds ", rows.values.size(), " floats, ",
          rows.updates.size(), " row counts and ", rows.slots.size(), " slots; the model has ", n,
          " floats and ", spec.embeddings[e].vocab, " rows"));
    }
  }
  return absl::OkStatus();
}

void ApplyOptimizer(const core::Optimizer& opt, float* w, const float* g,
                    std::vector<std::vector<float>>& slots, size_t n, int64_t update,
                    size_t offset) {
  std::vector<float*> ptrs;
  for (auto& s : slots) ptrs.push_back(s.data() + offset);
  opt.Apply(w, g, ptrs.empty() ? nullptr : ptrs.data(), n, update);
}

absl::StatusOr<data::BatchIterator> DataParallelBatches(const PlacementContext& ctx) {
  return data::BatchIterator::Create(ctx.train, ctx.rank, ctx.world, ctx.batch_size, ctx.seed);
}

absl::StatusOr<std::unique_ptr<model::Model>> NewModel(const PlacementContext& ctx,
                                                       const model::InstanceOptions& options) {
  if (ctx.model == nullptr) return absl::FailedPreconditionError("a placement needs a model");
  return ctx.model->Create(ctx.backend, options);
}

void BatchAt(data::BatchIterator* it, int64_t step, data::Batch* out) {
  const int64_t per_epoch = it->batches_per_epoch();
  (void)it->Seek({step / per_epoch, step % per_epoch});  // in range by construction
  it->Next(out);
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Placement>> MakePlacement(Mode mode, const PlacementContext& ctx) {
  switch (mode) {
    case coord::PS:
      return internal::MakePsPlacement(ctx);
    case coord::ALLREDUCE:
      return internal::MakeAllReducePlacement(ctx);
    case coord::FSDP:
      return internal::MakeFsdpPlacement(ctx);
    case coord::PIPELINE:
      return internal::MakePipelinePlacement(ctx);
    case coord::TENSOR:
      return internal::MakeTensorPlacement(ctx);
    default:
      return coord::CheckMode("mode", mode);
  }
}

}  // namespace pscluster::modes
