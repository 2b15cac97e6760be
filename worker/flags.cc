// ps_worker's command line: every flag, and WorkerFlags built from them.
#include "worker/flags.h"

#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/address.h"
#include "common/security_flags.h"
#include "common/status_macros.h"
#include "core/optimizer/optimizer_config.h"

ABSL_FLAG(std::vector<std::string>, ps, {},
          "ps_server addresses, in shard-id order (or use --coordinator).");
ABSL_FLAG(std::string, coordinator, "",
          "ps_coordinator address: register, wait for the whole cluster, take the shard "
          "addresses from its view, heartbeat and report progress.");
ABSL_FLAG(int, rank, 0, "This worker's rank in [0, world).");
ABSL_FLAG(int, world, 1, "Number of workers.");
ABSL_FLAG(int, epochs, 10, "Training epochs.");
ABSL_FLAG(int, batch_size, 64, "Examples per step per worker.");
ABSL_FLAG(int64_t, max_steps, 0,
          "> 0: stop after this many steps (evaluating there), before the epochs' end; the "
          "learning rate decays over them.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the data order and the initial parameters.");
ABSL_FLAG(std::string, optimizer, "adam",
          "Server-side optimizer: sgd|momentum|adagrad|adam|adamw|ftrl.");
ABSL_FLAG(double, lr, 1e-3, "Learning rate.");
ABSL_FLAG(
    double, lr_decay, 0.1,
    "The learning rate decays exponentially to this fraction by the last step (1: constant).");
ABSL_FLAG(int64_t, lr_warmup_steps, -1,
          "The learning rate rises linearly to --lr over this many steps (0: none; -1: the "
          "model's default, 100 for gpt, which collapses to the byte frequencies without it at "
          "lr 1e-3, and 0 for the others).");
ABSL_FLAG(std::string, consistency, "bsp", "bsp | ssp:<staleness> | asp.");
ABSL_FLAG(std::string, model, "mlp",
          "The model: mlp (--layers) or embedding (an embedding table of bucketed input "
          "features under the same MLP), both on Fashion-MNIST; or gpt (a decoder-only "
          "transformer, --gpt_*) on byte-level text (--text_dir).");
ABSL_FLAG(int, gpt_layers, 4, "gpt: transformer blocks.");
ABSL_FLAG(int, gpt_heads, 4, "gpt: attention heads (must divide --gpt_width).");
ABSL_FLAG(int, gpt_width, 256, "gpt: the model width (embedding size).");
ABSL_FLAG(int, gpt_context, 128, "gpt: tokens (bytes) per example.");
ABSL_FLAG(std::string, text_dir, "/usr/share/games/fortunes",
          "gpt: the text corpus, Debian's fortunes files (package fortunes); every 10th fortune "
          "is held out for the validation loss.");
ABSL_FLAG(std::vector<std::string>, layers,
          std::vector<std::string>({"784", "256", "128", "64", "10"}),
          "MLP layer sizes: input, hidden..., classes.");
ABSL_FLAG(std::string, dataset_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST IDX .gz files (Debian package dataset-fashion-mnist).");
ABSL_FLAG(int64_t, synthetic, 0, "Tests: train on this many synthetic examples instead.");
ABSL_FLAG(std::string, backend, "cpu", "cpu | cuda.");
ABSL_FLAG(std::string, mode, "",
          "The mode training starts in: ps (parameters on the shards), allreduce (a replica per "
          "worker), fsdp (parameters and optimizer state sharded over the workers) or pipeline "
          "(a stage of layers per worker, 1F1B micro-batches). Default: the coordinator's mode "
          "(ps without one). The collective modes need --coordinator (the rendezvous).");
ABSL_FLAG(int, micro_batches, 4, "pipeline: micro-batches per global batch.");
ABSL_FLAG(double, bucket_mb, 25,
          "allreduce: gradients are all-reduced in buckets of at most this many MiB, each as "
          "soon as the backward pass filled it.");
ABSL_FLAG(bool, overlap_allreduce, true,
          "allreduce: all-reduce each bucket on a communication thread while the backward pass "
          "of the earlier layers goes on (as PyTorch DDP does); false: on the training thread, "
          "after each bucket fills. (CPU backend; the CUDA backend always does the latter.)");
ABSL_FLAG(bool, fsdp_reshard_after_forward, true,
          "fsdp: free each layer's gathered parameters after its forward and gather them "
          "again for its backward (ZeRO-3: a worker holds 1/M of the state plus one layer); "
          "false keeps them from the forward to the backward, as PyTorch's SHARD_GRAD_OP: one "
          "all-gather per layer and step instead of two, for the whole model's parameters and "
          "gradients held during the step. The results are the same bits either way.");
ABSL_FLAG(bool, overlap_push, true,
          "ps with --consistency=ssp:S (S >= 1) or asp: push/pull a step's gradients and "
          "parameters on a communication thread while the next step computes on parameters "
          "one step older, which that consistency allows; false: every step waits for its "
          "own push/pull. (BSP and ssp:0 always wait.)");
ABSL_FLAG(int, switch_poll_steps, 8,
          "Ask the coordinator for mode switches every this many steps (a next-boundary switch "
          "lands at most this far ahead).");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Collective modes: the address other workers reach this one at.");
ABSL_FLAG(std::string, collectives, "gloo",
          "gloo (TCP) | nccl (GPUs; needs --backend=cuda and a --config=cuda build): the "
          "collective modes' communicator. NCCL is staged through device buffers.");
ABSL_FLAG(int, cuda_device, -1, "--backend=cuda: the GPU to use (-1: rank modulo the GPUs).");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(120),
          "A collective that waits this long for a peer fails, naming it (e.g. 120s, 2m).");
ABSL_FLAG(absl::Duration, collective_spin, absl::Microseconds(200),
          "Gloo: how long a receive polls its socket before it sleeps (waking costs tens of "
          "microseconds a message); 0 where workers share cores with other busy processes.");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Minutes(2),
          "How long one call to a shard (a BSP step waiting for the other workers included) "
          "may take before the step fails (e.g. 2m).");
ABSL_FLAG(absl::Duration, progress_every, absl::Seconds(5), "Time between progress lines.");
ABSL_FLAG(std::string, summary_json, "", "Write the final figures here as JSON.");
ABSL_FLAG(std::string, steps_file, "",
          "Append a JSON line per step (loss, time, communication, mode) and per rollback "
          "to this file, for plots; empty: none.");
ABSL_FLAG(int, snapshot_every_epochs, 0,
          "Rank 0 asks the coordinator for a cluster checkpoint every this many epochs (the "
          "shards need --data_dir).");

namespace pscluster::worker {
namespace {

absl::StatusOr<ps::OptimizerConfig> ParseOptimizer(const std::string& name, double lr) {
  ps::OptimizerConfig::Kind kind;
  if (!ps::OptimizerConfig::Kind_Parse(absl::AsciiStrToUpper(name), &kind)) {
    return absl::InvalidArgumentError(
        "--optimizer=" + name + " is unknown; use sgd, momentum, adagrad, adam, adamw or ftrl");
  }
  return core::DefaultOptimizerConfig(kind, static_cast<float>(lr));
}

absl::StatusOr<ps::ConsistencyConfig> ParseConsistency(const std::string& text) {
  ps::ConsistencyConfig c;
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  int staleness = 0;
  if (parts[0] == "bsp" && parts.size() == 1) {
    c.set_mode(ps::ConsistencyConfig::BSP);
  } else if (parts[0] == "asp" && parts.size() == 1) {
    c.set_mode(ps::ConsistencyConfig::ASP);
  } else if (parts[0] == "ssp" && parts.size() == 2 && absl::SimpleAtoi(parts[1], &staleness) &&
             staleness >= 0) {
    c.set_mode(ps::ConsistencyConfig::SSP);
    c.set_staleness(staleness);
  } else {
    return absl::InvalidArgumentError("--consistency=" + text +
                                      " is not bsp, asp or ssp:<staleness>");
  }
  return c;
}

absl::Status Check(bool ok, const std::string& message) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(message);
}

// --model and --layers.
absl::StatusOr<model::ModelConfig> ModelFromFlags() {
  model::ModelConfig m;
  m.name = absl::GetFlag(FLAGS_model);
  m.mlp.layers.clear();
  for (const std::string& l : absl::GetFlag(FLAGS_layers)) {
    int n = 0;
    RETURN_IF_ERROR(
        Check(absl::SimpleAtoi(l, &n) && n >= 1, "--layers holds '" + l + "', not a size"));
    m.mlp.layers.push_back(n);
  }
  if (m.mlp.layers.size() >= 2) {  // --model=embedding: the same input, hidden, classes
    m.embedding.features = m.mlp.layers.front();
    m.embedding.classes = m.mlp.layers.back();
    m.embedding.hidden.assign(m.mlp.layers.begin() + 1, m.mlp.layers.end() - 1);
    m.embedding.range_lo = 0;  // Fashion-MNIST pixels are in [0, 1]
    m.embedding.range_hi = 1;
  }
  m.gpt.layers = absl::GetFlag(FLAGS_gpt_layers);
  m.gpt.heads = absl::GetFlag(FLAGS_gpt_heads);
  m.gpt.width = absl::GetFlag(FLAGS_gpt_width);
  m.gpt.context = absl::GetFlag(FLAGS_gpt_context);
  if (m.name == "gpt") {
    absl::Status s = model::ValidateGpt(m.gpt);
    if (!s.ok()) return absl::InvalidArgumentError("--gpt_*: " + std::string(s.message()));
  }
  return m;
}

// The trainer's options that come straight from flags (not the coordinator, the
// connection or the mode).
absl::StatusOr<modes::TrainerOptions> TrainerFromFlags() {
  modes::TrainerOptions o;
  o.shards = absl::GetFlag(FLAGS_ps);
  for (const std::string& shard : o.shards) RETURN_IF_ERROR(CheckHostPort(shard, "--ps"));
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world = absl::GetFlag(FLAGS_world);
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.max_steps = absl::GetFlag(FLAGS_max_steps);
  RETURN_IF_ERROR(Check(o.max_steps >= 0, "--max_steps must be >= 0"));
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  RETURN_IF_ERROR(Check(absl::GetFlag(FLAGS_bucket_mb) > 0, "--bucket_mb must be > 0"));
  o.bucket_bytes = modes::BucketBytes(absl::GetFlag(FLAGS_bucket_mb));
  o.overlap_allreduce = absl::GetFlag(FLAGS_overlap_allreduce);
  o.fsdp_reshard_after_forward = absl::GetFlag(FLAGS_fsdp_reshard_after_forward);
  o.overlap_push = absl::GetFlag(FLAGS_overlap_push);
  o.switch_poll_steps = absl::GetFlag(FLAGS_switch_poll_steps);
  RETURN_IF_ERROR(Check(o.switch_poll_steps >= 1, "--switch_poll_steps must be >= 1"));
  o.progress_every = absl::GetFlag(FLAGS_progress_every);
  o.steps_file = absl::GetFlag(FLAGS_steps_file);
  o.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  RETURN_IF_ERROR(Check(o.rpc_timeout > absl::ZeroDuration(), "--rpc_timeout must be positive"));
  o.snapshot_every_epochs = absl::GetFlag(FLAGS_snapshot_every_epochs);
  o.lr_decay = static_cast<float>(absl::GetFlag(FLAGS_lr_decay));
  o.lr_warmup_steps = absl::GetFlag(FLAGS_lr_warmup_steps);
  RETURN_IF_ERROR(Check(o.lr_warmup_steps >= -1, "--lr_warmup_steps must be >= 0 (or -1)"));
  RETURN_IF_ERROR(Check(o.lr_decay > 0 && o.lr_decay <= 1, "--lr_decay must be in (0, 1]"));
  RETURN_IF_ERROR(
      Check(o.world >= 1 && o.rank >= 0 && o.rank < o.world, "--rank must be in [0, --world)"));
  RETURN_IF_ERROR(Check(o.epochs >= 1, "--epochs must be >= 1"));
  ASSIGN_OR_RETURN(o.optimizer,
                   ParseOptimizer(absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr)));
  ASSIGN_OR_RETURN(o.consistency, ParseConsistency(absl::GetFlag(FLAGS_consistency)));
  ASSIGN_OR_RETURN(o.model, ModelFromFlags());
  if (o.lr_warmup_steps < 0) o.lr_warmup_steps = o.model.name == "gpt" ? 100 : 0;
  return o;
}

}  // namespace

absl::StatusOr<WorkerFlags> WorkerFlagsFromCommandLine() {
  WorkerFlags f;
  ASSIGN_OR_RETURN(f.trainer, TrainerFromFlags());
  ASSIGN_OR_RETURN(f.trainer.security, SecurityFromFlags());
  f.mode = absl::GetFlag(FLAGS_mode);
  f.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (!f.coordinator.empty()) RETURN_IF_ERROR(CheckHostPort(f.coordinator, "--coordinator"));
  f.host = absl::GetFlag(FLAGS_host);
  f.collectives = absl::GetFlag(FLAGS_collectives);
  f.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  f.collective_spin = absl::GetFlag(FLAGS_collective_spin);
  f.backend = absl::GetFlag(FLAGS_backend);
  f.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  f.dataset_dir = absl::GetFlag(FLAGS_dataset_dir);
  f.text_dir = absl::GetFlag(FLAGS_text_dir);
  f.synthetic = absl::GetFlag(FLAGS_synthetic);
  f.summary_json = absl::GetFlag(FLAGS_summary_json);
  RETURN_IF_ERROR(Check(f.collectives == "gloo" || f.collectives == "nccl",
                        "--collectives must be gloo or nccl"));
  RETURN_IF_ERROR(Check(f.collectives != "nccl" || f.backend == "cuda",
                        "--collectives=nccl needs --backend=cuda"));
  RETURN_IF_ERROR(
      Check(f.backend == "cpu" || f.backend == "cuda", "--backend must be cpu or cuda"));
  RETURN_IF_ERROR(Check(!f.trainer.shards.empty() || !f.coordinator.empty(),
                        "give --coordinator (or --ps with ps_server addresses)"));
  RETURN_IF_ERROR(Check(f.collective_timeout > absl::ZeroDuration(),
                        "--collective_timeout must be positive (how long a collective waits "
                        "for a peer before it names it and fails)"));
  RETURN_IF_ERROR(
      Check(f.collective_spin >= absl::ZeroDuration(), "--collective_spin must be >= 0"));
  RETURN_IF_ERROR(Check(f.synthetic >= 0, "--synthetic must be >= 0 (0: the real data)"));
  RETURN_IF_ERROR(Check(f.trainer.snapshot_every_epochs >= 0,
                        "--snapshot_every_epochs must be >= 0 (0: never)"));
  return f;
}

}  // namespace pscluster::worker
