// The five ways a worker group trains the same model, as "placements" of its training
// state (parameters, optimizer slots, update count) across workers and shards:
//
//   PS         the shards hold everything; workers pull, compute, push (BSP/SSP/ASP).
//   ALLREDUCE  every worker holds a replica; gradients are averaged by an all-reduce.
//   FSDP       worker r of M holds 1/M of every tensor and of its optimizer state; each
//              layer is all-gathered before its forward and backward, its gradient
//              reduce-scattered, and each worker steps its own shard.
//   PIPELINE   worker k holds a contiguous stage of layers; the global batch runs as
//              micro-batches in a 1F1B schedule, activations and gradients by send/recv.
//   TENSOR     worker r holds its part of every layer (heads, MLP units, vocabulary:
//              Megatron-LM); every worker runs the global batch, partial activations and
//              input gradients are all-reduced inside each layer.
//
// All of them see the same global batch per step (the union of the ranks' batches of the
// data-parallel order), average the same gradient and apply the server's optimizer code
// (core/optimizer), so they compute the same training run up to float rounding. They
// are written against the model interface (worker/model/model.h); which PS table holds
// which tensor is model_tables.h's rule.
// A live switch gathers the full state on every worker (Gather) and hands it to the new
// placement (Load) at a step boundary.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/ps/parameter_store.h"
#include "common/training_mode.h"
#include "core/optimizer/optimizer.h"
#include "proto/ps.pb.h"
#include "worker/collective/communicator.h"
#include "worker/compute/backend.h"
#include "worker/data/batches.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"

namespace pscluster::modes {

// The training modes are the wire's (proto/coordinator.proto); their names and parsing are
// common/training_mode.h's.
using Mode = coord::TrainingMode;

// An embedding table's whole state, dense over its vocabulary (the collective modes hold
// it so; the shards create rows on first touch from the same initializer).
struct RowsState {
  std::vector<float> values;              // vocab x dim
  std::vector<std::vector<float>> slots;  // [optimizer slot] vocab x dim
  std::vector<int64_t> updates;           // per row: optimizer updates applied to it
};

// The whole training state at a step boundary: dense tensors in ModelSpec::params order,
// embedding tables in ModelSpec::embeddings order.
struct ModelState {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::vector<float>>> slots;  // [param][optimizer slot]
  int64_t updates = 0;  // optimizer updates applied so far (Adam's bias correction, lr decay)
  std::vector<RowsState> embeddings;
};

// The state every mode starts from: the spec's initializers and the optimizer's initial
// slots (rows as the shards would create them on first touch).
ModelState InitialState(const model::ModelSpec& spec, const core::Optimizer& opt);

// What a model of `spec` can run (coord::CheckModeFits): the placements check it, and the
// worker registers it so the coordinator refuses a switch to a mode the model cannot take.
coord::ModeLimits ModeLimitsOf(const model::ModelSpec& spec);

// Every id of an embedding table, ascending: [0, vocab).
std::vector<uint64_t> AllIds(const model::EmbeddingSpec& table);

// Puts `state`'s dense tensors and every embedding row into `model` (a whole-model
// instance of `spec`): evaluation, the ALLREDUCE replica, references.
absl::Status SetWholeState(model::Model* model, const model::ModelSpec& spec,
                           const ModelState& state);

// True when no row of any embedding table has been updated (the state the shards' sparse
// tables are in before training: they create rows on first touch).
bool EmbeddingsUntouched(const ModelState& state);

// Writes the whole state into the PS tables as the state before `step` (ImportDense on
// every dense table, concurrently): entering PS mode, and the collective modes'
// checkpoints. UNIMPLEMENTED when an embedding table has updated rows (the shards cannot
// import sparse tables yet).
absl::Status ImportState(ParameterStore* ps, const model::ModelSpec& spec, const ModelState& state,
                         int64_t step);

// What a placement works with; owned by the caller and outliving the placement.
struct PlacementContext {
  const model::ModelDef* model = nullptr;
  int rank = 0;
  int world = 1;
  int batch_size = 64;  // per worker; the global batch is world * batch_size
  uint64_t seed = 1;
  int micro_batches = 4;  // PIPELINE: micro-batches per global batch
  // ALLREDUCE: gradients are all-reduced in buckets of at most this many bytes, each as
  // soon as the backward pass has filled it (PyTorch DDP's default cap: 25 MiB).
  size_t bucket_bytes = size_t{25} << 20;
  // ALLREDUCE: the buckets are all-reduced on a communication thread, in order, while the
  // backward pass goes on (PyTorch's c10d Work); the step waits for them all before any
  // update. False, or the CUDA backend (its streams belong to the training thread): on the
  // training thread. The sums are the same either way.
  bool overlap_allreduce = true;
  // FSDP: a layer's gathered parameters are dropped after its forward and gathered again
  // before its backward (ZeRO-3: 1/M of the state plus one layer held). False: kept from
  // the forward to the backward in the model's own buffers (PyTorch's SHARD_GRAD_OP: one
  // all-gather per layer and step, the whole model's parameters and gradients held).
  bool fsdp_reshard_after_forward = true;
  // PS: step S's dense push/pull runs on a communication thread while step S+1 computes on
  // the parameters from step S-1's (ps_placement.cc). Only where the tables' consistency
  // lets a step read parameters one step stale (SSP with staleness >= 1, ASP).
  bool overlap_push = false;
  const data::Dataset* train = nullptr;
  compute::Backend* backend = nullptr;
  collective::Communicator* comm = nullptr;    // collective modes (size() == world)
  ParameterStore* ps = nullptr;                // PS mode (PsClient; in-process in tests)
  const core::Optimizer* optimizer = nullptr;  // collective modes (PS: the tables' own)
  // PS, rank 0, after it imported a state into the tables (Load): waits until replicated
  // shards hold it on every live replica (Trainer::AwaitWholeChains). Unset: no wait.
  std::function<void()> after_import;
};

class Placement {
 public:
  virtual ~Placement() = default;
  virtual Mode mode() const = 0;
  // Takes over `state` (the same on every rank) as the state before step `step`.
  virtual absl::Status Load(const ModelState& state, int64_t step) = 0;
  // The whole state before step `step`, on every rank (collective: every rank calls it).
  // Without slots: parameters only (for evaluation and checksums).
  virtual absl::StatusOr<ModelState> Gather(int64_t step, bool with_slots) = 0;
  // Trains step `step` on the global batch of that step; returns this worker's view of the
  // training loss (data-parallel modes: of its own batch; PIPELINE: of the global batch).
  virtual absl::StatusOr<float> Step(int64_t step) = 0;
  // Completes the communication of the steps run so far (PS with overlap_push: the push/pull
  // in flight), so that a checkpoint at this boundary holds them. Gather and Load do too.
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // Mode-specific figures for the summary (e.g. "bubble": measured pipeline bubble).
  virtual std::vector<std::pair<std::string, double>> Figures() const { return {}; }
};

absl::StatusOr<std::unique_ptr<Placement>> MakePlacement(Mode mode, const PlacementContext& ctx);

}  // namespace pscluster::modes
