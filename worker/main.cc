// ps_worker: trains the MLP on Fashion-MNIST in any of the four modes (parameter server,
// all-reduce, FSDP, pipeline), switched live by the coordinator.
//
//   ps_worker --coordinator=127.0.0.1:4000 --rank=0 --world=2 --epochs=10
//   ps_worker --ps=127.0.0.1:5000,127.0.0.1:5001 --rank=0 --world=2   (PS mode only)
//
// Prints progress (epoch, step, loss, samples/s, ETA) and the test accuracy after each
// epoch; --summary_json writes the final figures for scripts.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/coordinator/coordinator_client.h"
#include "common/status_macros.h"
#include "core/optimizer/optimizer_config.h"
#include "worker/collective/coordinator_store.h"
#include "worker/collective/staging_communicator.h"
#include "worker/compute/cuda_device.h"
#include "worker/modes/trainer.h"

ABSL_FLAG(std::vector<std::string>, ps, {},
          "ps_server addresses, in shard-id order (or use --coordinator).");
ABSL_FLAG(std::string, coordinator, "",
          "ps_coordinator address: register, wait for the whole cluster, take the shard "
          "addresses from its view, heartbeat and report progress.");
ABSL_FLAG(int, rank, 0, "This worker's rank in [0, world).");
ABSL_FLAG(int, world, 1, "Number of workers.");
ABSL_FLAG(int, epochs, 10, "Training epochs.");
ABSL_FLAG(int, batch_size, 64, "Examples per step per worker.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the data order and the initial parameters.");
ABSL_FLAG(std::string, optimizer, "adam",
          "Server-side optimizer: sgd|momentum|adagrad|adam|adamw|ftrl.");
ABSL_FLAG(double, lr, 1e-3, "Learning rate.");
ABSL_FLAG(
    double, lr_decay, 0.1,
    "The learning rate decays exponentially to this fraction by the last step (1: constant).");
ABSL_FLAG(std::string, consistency, "bsp", "bsp | ssp:<staleness> | asp.");
ABSL_FLAG(std::vector<std::string>, layers,
          std::vector<std::string>({"784", "256", "128", "64", "10"}),
          "MLP layer sizes: input, hidden..., classes.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
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
ABSL_FLAG(int, switch_poll_steps, 8,
          "Ask the coordinator for mode switches every this many steps (a next-boundary switch "
          "lands at most this far ahead).");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Collective modes: the address other workers reach this one at.");
ABSL_FLAG(std::string, collectives, "gloo",
          "gloo (TCP) | nccl (GPUs; needs --backend=cuda and a --config=cuda build): the "
          "collective modes' communicator. NCCL is staged through device buffers.");
ABSL_FLAG(int, cuda_device, -1, "--backend=cuda: the GPU to use (-1: rank modulo the GPUs).");
ABSL_FLAG(int, collective_timeout_seconds, 120,
          "A collective that waits this long for a peer fails, naming it.");
ABSL_FLAG(int, progress_seconds, 5, "Seconds between progress lines.");
ABSL_FLAG(std::string, summary_json, "", "Write the final figures here as JSON.");
ABSL_FLAG(int, snapshot_every_epochs, 0,
          "Rank 0 asks the coordinator for a cluster checkpoint every this many epochs (the "
          "shards need --data_dir).");

namespace {

using namespace pscluster;

// --cuda_device, or this rank's GPU when there are several (workers of a node share them).
int CudaDevice(int rank) {
  if (const int d = absl::GetFlag(FLAGS_cuda_device); d >= 0) return d;
  auto gpus = compute::CudaDevices();
  return gpus.ok() && !gpus->empty() ? rank % static_cast<int>(gpus->size()) : 0;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "ps_worker: %s\n", message.c_str());
  return 2;
}

absl::StatusOr<ps::OptimizerConfig> ParseOptimizer(const std::string& name, double lr) {
  ps::OptimizerConfig c;
  ps::OptimizerConfig::Kind kind;
  if (!ps::OptimizerConfig::Kind_Parse(absl::AsciiStrToUpper(name), &kind)) {
    return absl::InvalidArgumentError(
        "--optimizer=" + name + " is unknown; use sgd, momentum, adagrad, adam, adamw or ftrl");
  }
  c = core::DefaultOptimizerConfig(kind, static_cast<float>(lr));
  return c;
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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains the MLP: ps_worker --coordinator=ADDR --rank=R --world=W [--mode=MODE] "
      "(or --ps=ADDR,... for PS mode without a coordinator)");
  absl::ParseCommandLine(argc, argv);
  // Gloo writes to sockets with writev: a peer that died must be an error, not SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  // Every step allocates and frees the same ~0.5 MB message buffers: keep them in the heap
  // instead of fresh mmaps whose pages fault in again each time.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  modes::TrainerOptions o;
  o.shards = absl::GetFlag(FLAGS_ps);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world = absl::GetFlag(FLAGS_world);
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  if (!(absl::GetFlag(FLAGS_bucket_mb) > 0)) return Fail("--bucket_mb must be > 0");
  o.bucket_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_bucket_mb) * (1 << 20));
  o.switch_poll_steps = absl::GetFlag(FLAGS_switch_poll_steps);
  if (o.switch_poll_steps < 1) return Fail("--switch_poll_steps must be >= 1");
  o.progress_every = absl::Seconds(absl::GetFlag(FLAGS_progress_seconds));
  o.snapshot_every_epochs = absl::GetFlag(FLAGS_snapshot_every_epochs);
  o.lr_decay = static_cast<float>(absl::GetFlag(FLAGS_lr_decay));
  if (!(o.lr_decay > 0 && o.lr_decay <= 1)) return Fail("--lr_decay must be in (0, 1]");
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world) return Fail("--rank must be in [0, --world)");
  if (o.epochs < 1) return Fail("--epochs must be >= 1");
  if (const std::string c = absl::GetFlag(FLAGS_collectives); c != "gloo" && c != "nccl") {
    return Fail("--collectives must be gloo or nccl");
  } else if (c == "nccl" && absl::GetFlag(FLAGS_backend) != "cuda") {
    return Fail("--collectives=nccl needs --backend=cuda");
  }
  std::string mode = absl::GetFlag(FLAGS_mode);
  std::unique_ptr<CoordinatorClient> coordinator;
  if (const std::string c = absl::GetFlag(FLAGS_coordinator); !c.empty()) {
    CoordinatorClientOptions co;
    co.coordinator = c;
    co.role = coord::WORKER;
    co.id = o.rank;
    co.address = absl::StrCat("pid:", getpid());
    auto registered = CoordinatorClient::Register(co);
    if (!registered.ok()) return Fail(registered.status().ToString());
    coordinator = *std::move(registered);
    auto view = coordinator->AwaitView(0, /*complete=*/true, absl::Minutes(5));
    if (!view.ok()) return Fail(view.status().ToString());
    if (view->num_workers() != o.world) {
      return Fail(absl::StrCat("--world=", o.world, " but the coordinator expects ",
                               view->num_workers(), " workers"));
    }
    std::printf("worker %d: cluster complete (view %lld, mode %s): shards %s\n", o.rank,
                static_cast<long long>(view->version()), coord::ModeName(view->mode()),
                absl::StrJoin(view->shard_addresses(), ",").c_str());
    if (mode.empty()) mode = coord::ModeName(view->mode());
    o.coordinator = coordinator.get();
    const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_collective_timeout_seconds));
    const std::string host = absl::GetFlag(FLAGS_host);
    const std::string collectives = absl::GetFlag(FLAGS_collectives);
    o.connect = [&coordinator, &o, timeout, host, collectives](const std::string& generation)
        -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
      if (collectives == "nccl") {
        collective::CoordinatorKeyValue kv(coordinator.get());
        collective::NcclOptions n;
        n.rank = o.rank;
        n.size = o.world;
        n.device = CudaDevice(o.rank);
        n.timeout = timeout;
        n.key_prefix = generation + "nccl/";
        ASSIGN_OR_RETURN(auto nccl, collective::CreateNcclCommunicator(&kv, n));
        ASSIGN_OR_RETURN(auto staging, compute::MakeCudaBackend(n.device));
        return collective::MakeStagingCommunicator(std::move(nccl), std::move(staging));
      }
      collective::CoordinatorStore store(coordinator.get(), generation, absl::Minutes(5));
      return collective::CreateGlooCommunicator(
          &store, collective::GlooOptions{o.rank, o.world, host, timeout});
    };
  }
  if (mode.empty()) mode = "ps";
  auto parsed_mode = coord::ParseMode(mode);
  if (!parsed_mode.ok()) return Fail("--mode: " + std::string(parsed_mode.status().message()));
  o.mode = *parsed_mode;
  if (o.mode != coord::PS && !coordinator) {
    return Fail("--mode=" + mode + " needs --coordinator (the workers' rendezvous)");
  }
  if (o.shards.empty() && !coordinator) {
    return Fail("give --coordinator (or --ps with ps_server addresses)");
  }
  auto optimizer = ParseOptimizer(absl::GetFlag(FLAGS_optimizer), absl::GetFlag(FLAGS_lr));
  if (!optimizer.ok()) return Fail(std::string(optimizer.status().message()));
  o.optimizer = *optimizer;
  auto consistency = ParseConsistency(absl::GetFlag(FLAGS_consistency));
  if (!consistency.ok()) return Fail(std::string(consistency.status().message()));
  o.consistency = *consistency;
  o.mlp.layers.clear();
  for (const std::string& l : absl::GetFlag(FLAGS_layers)) {
    int n = 0;
    if (!absl::SimpleAtoi(l, &n) || n < 1) return Fail("--layers holds '" + l + "', not a size");
    o.mlp.layers.push_back(n);
  }

  data::Dataset train, test;
  if (int64_t n = absl::GetFlag(FLAGS_synthetic); n > 0) {
    const int dim = o.mlp.layers.front(), classes = o.mlp.layers.back();
    // One draw, split: the held-out examples come from the same class centroids.
    const int64_t held_out = n / 5 + 1;
    data::Dataset all = data::MakeSynthetic(n + held_out, dim, classes, /*seed=*/7);
    auto take = [&](int64_t from, int64_t count) {
      data::Dataset d;
      d.size = count;
      d.dim = dim;
      d.classes = classes;
      d.x.assign(all.x.begin() + from * dim, all.x.begin() + (from + count) * dim);
      d.y.assign(all.y.begin() + from, all.y.begin() + from + count);
      return d;
    };
    train = take(0, n);
    test = take(n, held_out);
  } else {
    auto tr = data::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), data::Split::kTrain);
    if (!tr.ok()) return Fail(tr.status().ToString());
    auto te = data::LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), data::Split::kTest);
    if (!te.ok()) return Fail(te.status().ToString());
    train = *std::move(tr);
    test = *std::move(te);
  }
  std::unique_ptr<compute::Backend> backend;
  if (absl::GetFlag(FLAGS_backend) == "cuda") {
    auto cuda = compute::MakeCudaBackend(CudaDevice(o.rank));
    if (!cuda.ok()) return Fail("--backend=cuda: " + cuda.status().ToString());
    backend = *std::move(cuda);
  } else if (absl::GetFlag(FLAGS_backend) == "cpu") {
    backend = compute::MakeCpuBackend(1);
  } else {
    return Fail("--backend must be cpu or cuda");
  }
  auto trainer = modes::Trainer::Create(o, &train, &test, std::move(backend));
  if (!trainer.ok()) return Fail(trainer.status().ToString());
  absl::StatusOr<modes::TrainSummary> summary = (*trainer)->Run();
  if (!summary.ok()) return Fail(summary.status().ToString());
  std::printf("worker %d: done: %lld steps, test accuracy %.4f, %.0f samples/s\n", o.rank,
              static_cast<long long>(summary->steps), summary->test_accuracy,
              summary->samples_per_sec);
  if (const std::string path = absl::GetFlag(FLAGS_summary_json); !path.empty()) {
    std::ofstream f(path);
    f << absl::StrCat("{\"rank\": ", o.rank, ", \"mode\": \"", mode, "\", \"final_mode\": \"",
                      summary->final_mode, "\", \"steps\": ", summary->steps,
                      ", \"epochs\": ", summary->epochs, ", \"final_loss\": ", summary->final_loss,
                      ", \"test_accuracy\": ", summary->test_accuracy,
                      ", \"samples_per_sec\": ", summary->samples_per_sec,
                      ", \"train_seconds\": ", summary->train_seconds, ", \"snapshots\": [",
                      absl::StrJoin(summary->snapshots, ", "), "], \"rollbacks\": [",
                      absl::StrJoin(summary->rollbacks, ", ",
                                    [](std::string* out, const std::pair<int64_t, int64_t>& r) {
                                      absl::StrAppend(out, "[", r.first, ", ", r.second, "]");
                                    }),
                      "], \"switches\": [",
                      absl::StrJoin(summary->switches, ", ",
                                    [](std::string* out, const modes::SwitchDone& s) {
                                      absl::StrAppend(out, "{\"step\": ", s.step, ", \"from\": \"",
                                                      s.from, "\", \"to\": \"", s.to,
                                                      "\", \"handoff_seconds\": ", s.seconds, "}");
                                    }),
                      "], \"figures\": {",
                      absl::StrJoin(summary->figures, ", ",
                                    [](std::string* out, const std::pair<std::string, double>& f) {
                                      absl::StrAppend(out, "\"", f.first, "\": ", f.second);
                                    }),
                      "}, \"param_crc32c\": ", summary->param_crc32c, "}\n");
    if (!f) return Fail("cannot write --summary_json=" + path);
  }
  return 0;
}
