#include "client/ps/ps_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/backoff.h"
#include "common/grpc_status.h"
#include "common/random_id.h"
#include "common/sharding.h"
#include "common/status_macros.h"
#include "core/tensor/non_finite.h"
#include "grpcpp/grpcpp.h"

namespace pscluster {
namespace {

// The keys and gradient rows one sparse message may carry: a shard's default
// --max_chunk_bytes (its limit on a message is that plus 64 KiB, as the client's).
uint64_t SparseBytesPerCall(const PsClientOptions& options) {
  return options.max_message_bytes - (64 << 10);
}

// Keys [at, at + n) of `all`, with their gradient rows when it carries any (a push), as a
// request of its own.
ps::SparseRequest Slice(const ps::SparseRequest& all, int at, int n, size_t dim) {
  ps::SparseRequest part;
  part.set_worker_id(all.worker_id());
  part.set_step(all.step());
  part.set_table_id(all.table_id());
  part.mutable_keys()->Add(all.keys().begin() + at, all.keys().begin() + at + n);
  if (!all.grads().empty()) {
    part.set_grads(all.grads().substr(at * dim * sizeof(float), n * dim * sizeof(float)));
  }
  return part;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(PsClientOptions options) {
  if (options.shard_addresses.empty()) {
    return absl::InvalidArgumentError("PsClientOptions.shard_addresses is empty");
  }
  if (!options.shard_replicas.empty()) {
    if (options.shard_replicas.size() != options.shard_addresses.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PsClientOptions.shard_replicas has ", options.shard_replicas.size(),
                       " shards, shard_addresses ", options.shard_addresses.size()));
    }
    for (size_t s = 0; s < options.shard_replicas.size(); ++s) {
      if (options.shard_replicas[s].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("PsClientOptions.shard_replicas[", s, "] is empty"));
      }
    }
  }
  if (options.chunk_bytes < sizeof(float) ||
      options.chunk_bytes + 1024 > options.max_message_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("PsClientOptions.chunk_bytes=", options.chunk_bytes,
                     " must be in [4, max_message_bytes - 1024]"));
  }
  return std::unique_ptr<PsClient>(new PsClient(std::move(options)));
}

std::string NewClientId() { return RandomId(); }

PsClient::PsClient(PsClientOptions options)
    : options_([&] {
        if (options.client_id.empty()) options.client_id = NewClientId();
        return std::move(options);
      }()),
      calls_(options_) {}

absl::Status PsClient::RegisterWorker() {
  return calls_.ForEach([&](int s) {
    ps::RegisterWorkerRequest req;
    req.set_worker_id(options_.worker_id);
    ps::RegisterWorkerResponse resp;
    absl::Status st = calls_.Unary(s, &ps::ShardData::Stub::RegisterWorker, req, &resp);
    if (st.ok() && (resp.shard_id() != static_cast<uint32_t>(s) ||
                    resp.num_shards() != static_cast<uint32_t>(num_shards()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          calls_.Name(s), " says it is shard ", resp.shard_id(), " of ", resp.num_shards(),
          "; the client lists it as shard ", s, " of ", num_shards(), ": fix the address order"));
    }
    return st;
  });
}

absl::Status PsClient::UnregisterWorker() {
  return calls_.ForEach([&](int s) {
    ps::UnregisterWorkerRequest req;
    req.set_worker_id(options_.worker_id);
    ps::UnregisterWorkerResponse resp;
    return calls_.Unary(s, &ps::ShardData::Stub::UnregisterWorker, req, &resp);
  });
}

absl::Status PsClient::AwaitWorkers(int world, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Backoff backoff(absl::Milliseconds(10), absl::Milliseconds(200));
  while (true) {
    std::vector<int> counts(num_shards());
    absl::Status st = calls_.ForEach([&](int s) {
      ps::RegisterWorkerRequest req;
      req.set_worker_id(options_.worker_id);
      ps::RegisterWorkerResponse resp;
      absl::Status rs = calls_.Unary(s, &ps::ShardData::Stub::RegisterWorker, req, &resp);
      counts[s] = resp.registered_workers_size();
      return rs;
    });
    if (!st.ok()) return st;
    const int fewest = *std::min_element(counts.begin(), counts.end());
    if (fewest >= world) return absl::OkStatus();
    if (absl::Now() + backoff.ceiling() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "waited ", absl::FormatDuration(timeout), " for ", world,
          " workers to register; the emptiest shard has ", fewest, ": start the other workers"));
    }
    absl::SleepFor(backoff.Next());  // rendezvous poll, bounded by the deadline
  }
}

absl::Status PsClient::CreateTable(const ps::TableSpec& spec) {
  ps::CreateTableRequest req;
  req.set_worker_id(options_.worker_id);
  *req.mutable_spec() = spec;
  // Shard 0 first: of two clients creating one id with different specs at once, the one
  // shard 0 refuses stops there, and no shard is left holding the other's spec.
  ps::CreateTableResponse first;
  absl::Status st = calls_.Unary(0, &ps::ShardAdmin::Stub::CreateTable, req, &first);
  if (st.ok() && num_shards() > 1) {
    st = calls_.ForEach([&](int s) -> absl::Status {
      if (s == 0) return absl::OkStatus();
      ps::CreateTableResponse resp;
      return calls_.Unary(s, &ps::ShardAdmin::Stub::CreateTable, req, &resp);
    });
  }
  if (st.ok()) {
    absl::MutexLock lock(&mu_);
    specs_[spec.table_id()] = spec;
  }
  return st;
}

absl::StatusOr<std::vector<ps::TableInfo>> PsClient::DescribeTable(uint32_t table_id) {
  ps::DescribeTableRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_table_id(table_id);
  return calls_.All(&ps::ShardAdmin::Stub::DescribeTable, req);
}

absl::StatusOr<ps::TableSpec> PsClient::Spec(uint32_t table_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = specs_.find(table_id);
    if (it != specs_.end()) return it->second;
  }
  ps::DescribeTableRequest req;
  req.set_worker_id(options_.worker_id);
  req.set_table_id(table_id);
  ps::TableInfo info;
  absl::Status st = calls_.Unary(0, &ps::ShardAdmin::Stub::DescribeTable, req, &info);
  if (!st.ok()) return st;
  absl::MutexLock lock(&mu_);
  specs_[table_id] = info.spec();
  return info.spec();
}

absl::Status PsClient::CheckDense(const ps::TableSpec& spec, size_t length) {
  if (spec.kind() != ps::TableSpec::DENSE) {
    return absl::FailedPreconditionError(absl::StrCat("table ", spec.table_id(), " is not DENSE"));
  }
  if (length != spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec.table_id(), " holds ", spec.size(), " values; the buffer has ", length));
  }
  return absl::OkStatus();
}

absl::Status PsClient::CheckFinite(const ps::TableSpec& spec, absl::Span<const float> grad) {
  if (spec.skip_nonfinite()) return absl::OkStatus();
  const size_t bad = core::FirstNonFinite(grad);
  if (bad == grad.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table ", spec.table_id(), ": gradient index ",
                                                 bad, " is ", grad[bad],
                                                 "; nothing was pushed to any shard"));
}

absl::Status PsClient::PushDense(uint32_t table_id, int64_t step, absl::Span<const float> grad) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  RETURN_IF_ERROR(CheckDense(*spec, grad.size()));
  RETURN_IF_ERROR(CheckFinite(*spec, grad));
  return calls_.ForEach([&](int s) {
    Range r = DenseShardRange(grad.size(), s, num_shards());
    return PushDenseShard(s, table_id, step, r.begin, grad.subspan(r.begin, r.size()));
  });
}

absl::Status PsClient::PullDense(uint32_t table_id, int64_t step, absl::Span<float> out) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  RETURN_IF_ERROR(CheckDense(*spec, out.size()));
  return calls_.ForEach([&](int s) {
    Range r = DenseShardRange(out.size(), s, num_shards());
    return PullDenseShard(s, table_id, step, r.begin, out.subspan(r.begin, r.size()));
  });
}

absl::StatusOr<size_t> PsClient::SparseDim(uint32_t table_id, size_t keys, size_t values) {
  auto spec = Spec(table_id);
  if (!spec.ok()) return spec.status();
  if (spec->kind() != ps::TableSpec::SPARSE || values != keys * spec->dim()) {
    return absl::InvalidArgumentError(absl::StrCat("table ", table_id, " needs SPARSE keys x dim (",
                                                   keys, " x ", spec->dim(), ") values; got ",
                                                   values));
  }
  return spec->dim();
}

std::vector<ps::SparseRequest> PsClient::SparseRequests(uint32_t table_id, int64_t step) const {
  std::vector<ps::SparseRequest> reqs(num_shards());
  for (ps::SparseRequest& r : reqs) {
    r.set_worker_id(options_.worker_id);
    r.set_step(step);
    r.set_table_id(table_id);
  }
  return reqs;
}

absl::Status PsClient::PushSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                                  absl::Span<const float> grads) {
  auto dim_or = SparseDim(table_id, keys.size(), grads.size());
  if (!dim_or.ok()) return dim_or.status();
  const size_t dim = *dim_or;
  // As for NaN gradients (CheckFinite): a key only its shard would refuse is refused here.
  ASSIGN_OR_RETURN(const ps::TableSpec spec, Spec(table_id));
  RETURN_IF_ERROR(CheckFinite(spec, grads));
  std::vector<ps::SparseRequest> reqs = SparseRequests(table_id, step);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (spec.key_space() != 0 && keys[i] >= spec.key_space()) {
      return absl::OutOfRangeError(absl::StrCat("table ", table_id, ": key ", keys[i],
                                                " is outside its key space [0, ", spec.key_space(),
                                                "); nothing was pushed"));
    }
    ps::SparseRequest& r = reqs[SparseShardOf(keys[i], num_shards())];
    r.add_keys(keys[i]);
    r.mutable_grads()->append(reinterpret_cast<const char*>(grads.data() + i * dim),
                              dim * sizeof(float));
  }
  // One message carries at most the shards' default --max_chunk_bytes of keys and rows: a
  // larger part goes in several, numbered (a BSP shard counts the push at its last part).
  const int per_push = static_cast<int>(std::clamp<uint64_t>(
      SparseBytesPerCall(options_) / (sizeof(uint64_t) + dim * sizeof(float)), 1, INT32_MAX));
  std::vector<char> applied(num_shards(), 0);
  absl::Status status = calls_.ForEach([&](int s) -> absl::Status {
    const ps::SparseRequest& all = reqs[s];
    ps::PushSparseResponse resp;
    if (all.keys_size() <= per_push) {
      RETURN_IF_ERROR(calls_.Unary(s, &ps::ShardData::Stub::PushSparse, all, &resp));
      applied[s] = all.keys_size() > 0;
      return absl::OkStatus();
    }
    const int count = (all.keys_size() + per_push - 1) / per_push;
    for (int at = 0; at < all.keys_size(); at += per_push) {
      ps::SparseRequest piece = Slice(all, at, std::min(per_push, all.keys_size() - at), dim);
      piece.set_part(at / per_push);
      piece.set_parts(count);
      RETURN_IF_ERROR(calls_.Unary(s, &ps::ShardData::Stub::PushSparse, piece, &resp));
      applied[s] = 1;
    }
    return absl::OkStatus();
  });
  // A shard's own refusal (its row limit: only it knows how full it is) comes after the
  // others applied their parts: say so, and what to do.
  std::vector<int> done;
  for (int s = 0; s < num_shards(); ++s) {
    if (applied[s]) done.push_back(s);
  }
  if (status.ok() || done.empty()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), "; shard(s) ", absl::StrJoin(done, ", "),
                                   " applied their keys of this push (a sparse push is not "
                                   "atomic across shards): push the other shards' keys again "
                                   "for this step once they can take them, or restore a "
                                   "checkpoint"));
}

absl::Status PsClient::PullSparse(uint32_t table_id, int64_t step, absl::Span<const uint64_t> keys,
                                  absl::Span<float> out) {
  auto dim_or = SparseDim(table_id, keys.size(), out.size());
  if (!dim_or.ok()) return dim_or.status();
  const size_t dim = *dim_or;
  std::vector<ps::SparseRequest> reqs = SparseRequests(table_id, step);
  std::vector<std::vector<size_t>> positions(num_shards());
  for (size_t i = 0; i < keys.size(); ++i) {
    int s = SparseShardOf(keys[i], num_shards());
    reqs[s].add_keys(keys[i]);
    positions[s].push_back(i);
  }
  // An answer carries at most the shards' default --max_chunk_bytes of rows: more keys go
  // in several calls.
  const size_t per_call = std::max<size_t>(1, SparseBytesPerCall(options_) / (dim * sizeof(float)));
  return calls_.ForEach([&](int s) -> absl::Status {
    const size_t n_keys = positions[s].size();
    for (size_t at = 0; at == 0 || at < n_keys; at += per_call) {
      const size_t n = std::min(per_call, n_keys - at);
      ps::SparseRequest part;
      const ps::SparseRequest* req = &reqs[s];
      if (n != n_keys) {
        part = Slice(reqs[s], static_cast<int>(at), static_cast<int>(n), dim);
        req = &part;
      }
      ps::PullSparseResponse resp;
      RETURN_IF_ERROR(calls_.Waiting(s, [&](grpc::ClientContext* ctx, int) {
        return calls_.stub(s)->PullSparse(ctx, *req, &resp);
      }));
      if (resp.values().size() != n * dim * sizeof(float)) {
        return absl::InternalError(absl::StrCat(calls_.Name(s), " returned ", resp.values().size(),
                                                " bytes for ", n, " rows"));
      }
      const float* v = reinterpret_cast<const float*>(resp.values().data());
      for (size_t j = 0; j < n; ++j) {
        std::memcpy(out.data() + positions[s][at + j] * dim, v + j * dim, dim * sizeof(float));
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace pscluster
