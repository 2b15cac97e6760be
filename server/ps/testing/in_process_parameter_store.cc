#include "server/ps/testing/in_process_parameter_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pscluster::testing {

InProcessParameterStore::InProcessParameterStore(ps::Shard* shard, int32_t worker_id,
                                                 absl::Duration timeout)
    : shard_(shard), worker_(worker_id), timeout_(timeout) {
  shard_->RegisterWorker(worker_id);
}

absl::Status InProcessParameterStore::PullDenseMany(int64_t step, absl::Span<const uint32_t> tables,
                                                    absl::Span<const absl::Span<float>> out) {
  if (tables.size() != out.size()) return absl::InvalidArgumentError("tables and out differ");
  for (size_t i = 0; i < tables.size(); ++i) {
    ASSIGN_OR_RETURN(ps::DenseTable * t, shard_->GetDense(tables[i], worker_));
    RETURN_IF_ERROR(t->AwaitPullable(step, Deadline()));
    RETURN_IF_ERROR(t->Read(0, out[i]));
  }
  return absl::OkStatus();
}

absl::Status InProcessParameterStore::PushPullDenseMany(
    int64_t step, absl::Span<const uint32_t> tables,
    absl::Span<const absl::Span<const float>> grads, absl::Span<const absl::Span<float>> out) {
  if (tables.size() != grads.size()) return absl::InvalidArgumentError("tables and grads differ");
  for (size_t i = 0; i < tables.size(); ++i) {
    ASSIGN_OR_RETURN(ps::DenseTable * t, shard_->GetDense(tables[i], worker_));
    bool skipped = false;
    RETURN_IF_ERROR(t->Push(worker_, step, 0, {grads[i]}, &skipped));
  }
  return PullDenseMany(step + 1, tables, out);
}

absl::Status InProcessParameterStore::ExportDense(uint32_t table_id, int64_t step,
                                                  absl::Span<float> values,
                                                  std::vector<absl::Span<float>> slots,
                                                  int64_t* updates) {
  ASSIGN_OR_RETURN(ps::DenseTable * t, shard_->GetDense(table_id, worker_));
  ASSIGN_OR_RETURN(ps::DenseState state, t->ExportState(step, Deadline()));
  if (state.values.size() != values.size() || state.slots.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", table_id, " holds ",
                                                   state.values.size(), " values and ",
                                                   state.slots.size(), " slots"));
  }
  std::copy(state.values.begin(), state.values.end(), values.begin());
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k].size() != values.size()) return absl::InvalidArgumentError("slot size");
    std::copy(state.slots[k].begin(), state.slots[k].end(), slots[k].begin());
  }
  *updates = state.updates;
  return absl::OkStatus();
}

absl::Status InProcessParameterStore::ImportDense(
    uint32_t table_id, int64_t step, int64_t updates, absl::Span<const float> values,
    const std::vector<absl::Span<const float>>& slots) {
  ASSIGN_OR_RETURN(ps::DenseTable * t, shard_->GetDense(table_id, worker_));
  ps::DenseState state;
  state.range = t->range();
  state.updates = updates;
  state.values.assign(values.begin(), values.end());
  for (const auto& s : slots) state.slots.emplace_back(s.begin(), s.end());
  return t->ImportState(step, std::move(state));
}

absl::Status InProcessParameterStore::PushSparse(uint32_t table_id, int64_t step,
                                                 absl::Span<const uint64_t> keys,
                                                 absl::Span<const float> grads) {
  ASSIGN_OR_RETURN(ps::SparseTable * t, shard_->GetSparse(table_id, worker_));
  bool skipped = false;
  return t->Push(worker_, step, keys, grads, &skipped);
}

absl::Status InProcessParameterStore::PullSparse(uint32_t table_id, int64_t step,
                                                 absl::Span<const uint64_t> keys,
                                                 absl::Span<float> out) {
  ASSIGN_OR_RETURN(ps::SparseTable * t, shard_->GetSparse(table_id, worker_));
  RETURN_IF_ERROR(t->AwaitPullable(step, Deadline()));
  return t->Read(keys, out);
}

}  // namespace pscluster::testing
