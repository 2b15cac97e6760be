#include "server/ps/service/import_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/ps/service/raw_unary.h"

namespace pscluster::ps {
namespace {

// The header fields every chunk of one import stream must repeat unchanged.
absl::Status CheckSameState(const TableStateChunk& first, const TableStateChunk& c,
                            uint64_t index) {
  auto differs = [&](absl::string_view field, auto was, auto now) {
    return absl::InvalidArgumentError(absl::StrCat("import chunk ", index, " changes ", field,
                                                   " from ", was, " to ", now,
                                                   " within one stream"));
  };
  if (c.table_id() != first.table_id()) return differs("table_id", first.table_id(), c.table_id());
  if (c.step() != first.step()) return differs("step", first.step(), c.step());
  if (c.updates() != first.updates()) return differs("updates", first.updates(), c.updates());
  return absl::OkStatus();
}

// An import's error says that nothing was imported.
absl::Status NothingImported(const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), "; nothing was imported"));
}

}  // namespace

absl::StatusOr<DenseTable*> DenseForState(const Shard& shard, uint32_t table_id) {
  ASSIGN_OR_RETURN(Table * table, shard.GetTable(table_id));
  if (table->spec().kind() != TableSpec::DENSE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table_id ", table_id, " is a SPARSE table; ExportDense/ImportDense move dense tables"));
  }
  return static_cast<DenseTable*>(table);
}

uint64_t StateBytes(const DenseTable& table) {
  return table.range().size() * (1 + table.num_slots()) * sizeof(float);
}

ImportStream::ImportStream(ShardCore* core, grpc::CallbackServerContext* ctx,
                           grpc::ByteBuffer* resp, ReplaceWholeState replace)
    : ReadWhole(core, ctx, &core->admin_pool, "import stream cancelled; nothing was imported"),
      resp_(resp),
      replace_(std::move(replace)) {}

absl::Status ImportStream::Open() {
  RETURN_IF_ERROR(core_->gate.CheckServing());
  ASSIGN_OR_RETURN(DenseTable * table, DenseForState(*core_->shard, first_.table_id()));
  tables_ = core_->gate.tables_replaced();
  // Everything is received and checked before the table is touched: all or nothing. The
  // state is allocated whole at the first chunk: charge it before.
  RETURN_IF_ERROR(NothingImported(
      charge_.GrowTo(StateBytes(*table), absl::StrCat("the import of table ", first_.table_id()))));
  builder_ = std::make_unique<DenseStateBuilder>(table->id(), table->range(), table->num_slots());
  return absl::OkStatus();
}

absl::Status ImportStream::Take(const grpc::ByteBuffer& message, uint64_t index) {
  ShardCore::Scope scope(core_);
  TableStateChunk chunk;
  TableStateChunk& c = index == 0 ? first_ : chunk;
  if (!ParseRaw(message, &c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "import chunk ", index, " did not parse as a TableStateChunk; nothing was imported"));
  }
  if (index == 0) RETURN_IF_ERROR(Open());
  return NothingImported(Check(c, index));
}

absl::Status ImportStream::Check(const TableStateChunk& c, uint64_t index) {
  RETURN_IF_ERROR(CheckSameState(first_, c, index));
  const uint64_t bytes = (uint64_t{1} * c.values_size() + c.slots_size()) * sizeof(float);
  if (bytes > core_->options.max_chunk_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("import chunk ", index, " holds ", bytes,
                                                     " bytes of floats; the limit is ",
                                                     core_->options.max_chunk_bytes));
  }
  return builder_->Add(c.begin(), c.values(), c.num_slots(), c.slots());
}

absl::Status ImportStream::Apply(uint64_t messages) {
  if (messages == 0) return absl::InvalidArgumentError("import stream carried no chunks");
  ImportDenseResponse resp;
  RETURN_IF_ERROR(NothingImported(Install(&resp)));
  bool own = false;
  return FromGrpcStatus(
      grpc::SerializationTraits<ImportDenseResponse>::Serialize(resp, resp_, &own));
}

absl::Status ImportStream::Install(ImportDenseResponse* resp) {
  std::unique_ptr<absl::MutexLock> joins;  // before Scope: the replicator's lock order
  RETURN_IF_ERROR(replace_(&joins));
  ShardCore::Scope scope(core_);
  RETURN_IF_ERROR(core_->gate.CheckServing());
  if (core_->gate.tables_replaced() != tables_) {
    return absl::AbortedError(
        "the shard's tables were replaced (a restore, or a replica installing state) while "
        "this import was received");
  }
  ASSIGN_OR_RETURN(DenseTable * table, DenseForState(*core_->shard, first_.table_id()));
  ASSIGN_OR_RETURN(DenseState state, builder_->Finish(first_.updates()));
  const uint64_t received = state.values.size();
  RETURN_IF_ERROR(table->ImportState(first_.step(), std::move(state)));
  resp->set_values_received(received);
  resp->set_step(first_.step());
  return absl::OkStatus();
}

}  // namespace pscluster::ps
