#include "worker/setup.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/host_name.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/training_mode.h"
#include "nlohmann/json.hpp"
#include "worker/collective/coordinator_rendezvous.h"
#include "worker/collective/nccl_communicator.h"
#include "worker/collective/staging_communicator.h"
#include "worker/compute/cuda_device.h"
#include "worker/data/text.h"
#include "worker/model/registry.h"
#include "worker/modes/placement.h"

namespace pscluster::worker {
namespace {

// --cuda_device, or this rank's GPU when there are several (workers of a node share them).
int CudaDevice(int flag, int rank) {
  if (flag >= 0) return flag;
  auto gpus = compute::CudaDevices();
  return gpus.ok() && !gpus->empty() ? rank % static_cast<int>(gpus->size()) : 0;
}

// The communicator factory of the collective modes, rendezvoused through the coordinator.
void SetConnect(const WorkerFlags& f, CoordinatorClient* coordinator, modes::TrainerOptions* o) {
  const int rank = o->rank, world = o->world, device = CudaDevice(f.cuda_device, rank);
  const absl::Duration timeout = f.collective_timeout, spin = f.collective_spin;
  o->connect = [coordinator, rank, world, device, timeout, spin, host = f.host,
                nccl = f.collectives == "nccl"](const std::string& generation)
      -> absl::StatusOr<std::unique_ptr<collective::Communicator>> {
    collective::CoordinatorRendezvous rendezvous(coordinator);
    if (nccl) {
      collective::NcclOptions n;
      n.rank = rank;
      n.size = world;
      n.device = device;
      n.timeout = timeout;
      n.key_prefix = generation + "nccl/";
      ASSIGN_OR_RETURN(auto comm, collective::CreateNcclCommunicator(&rendezvous, n));
      ASSIGN_OR_RETURN(auto staging, compute::MakeCudaBackend(n.device));
      return collective::MakeStagingCommunicator(std::move(comm), std::move(staging));
    }
    collective::GlooOptions g;  // by name: Durations side by side
    g.rank = rank;
    g.size = world;
    g.host = host;
    g.timeout = timeout;
    g.spin = spin;
    g.key_prefix = generation;
    return collective::CreateGlooCommunicator(&rendezvous, g);
  };
}

// The first complete view, saying every 10 s who it waits for; up to 5 minutes.
absl::StatusOr<coord::ClusterView> AwaitCompleteCluster(CoordinatorClient* coordinator, int rank) {
  constexpr absl::Duration kSay = absl::Seconds(10), kLimit = absl::Minutes(5);
  const absl::Time give_up = absl::Now() + kLimit;
  while (true) {
    absl::StatusOr<coord::ClusterView> view =
        coordinator->AwaitView(0, /*complete=*/true, std::min(kSay, give_up - absl::Now()));
    if (view.ok() || !absl::IsDeadlineExceeded(view.status())) return view;
    absl::StatusOr<coord::ClusterView> now = coordinator->AwaitView(0, false, kSay);
    const std::string missing = now.ok() ? now->missing() : now.status().ToString();
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("the cluster was not complete within ", absl::FormatDuration(kLimit),
                       " (missing: ", missing, "): start them against this coordinator"));
    }
    LogInfo("worker %d: waiting for the cluster to be complete; missing: %s", rank,
            missing.c_str());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorClient>> JoinCluster(WorkerFlags* f) {
  modes::TrainerOptions& o = f->trainer;
  std::unique_ptr<CoordinatorClient> coordinator;
  if (!f->coordinator.empty()) {
    CoordinatorClientOptions co;
    co.coordinator = f->coordinator;
    co.role = coord::WORKER;
    co.id = o.rank;
    co.group_size = o.world;
    co.security = o.security;
    // Which process this member is, for operators: host name and pid (pid 1 in a container).
    const std::string host = HostName();
    co.address = absl::StrCat(host.empty() ? "?" : host, "/pid:", getpid());
    // The model's sizes are checked before joining; the coordinator learns what it can run.
    ASSIGN_OR_RETURN(std::unique_ptr<model::ModelDef> def, model::MakeModelDef(o.model, o.seed));
    co.limits = modes::ModeLimitsOf(def->spec());
    co.limits->set_batch_size(o.batch_size);
    co.limits->set_micro_batches(o.micro_batches);
    ASSIGN_OR_RETURN(coordinator, CoordinatorClient::Register(co));
    ASSIGN_OR_RETURN(coord::ClusterView view, AwaitCompleteCluster(coordinator.get(), o.rank));
    LogInfo("worker %d: cluster complete (view %lld, mode %s): shards %s", o.rank,
            static_cast<long long>(view.version()), coord::ModeName(view.mode()),
            absl::StrJoin(view.shard_addresses(), ",").c_str());
    if (f->mode.empty()) f->mode = coord::ModeName(view.mode());
    o.coordinator = coordinator.get();
    SetConnect(*f, coordinator.get(), &o);
  }
  if (f->mode.empty()) f->mode = "ps";
  absl::StatusOr<coord::TrainingMode> mode = coord::ParseMode(f->mode);
  if (!mode.ok())
    return absl::InvalidArgumentError("--mode: " + std::string(mode.status().message()));
  o.mode = *mode;
  if (o.mode != coord::PS && !coordinator) {
    return absl::InvalidArgumentError("--mode=" + f->mode +
                                      " needs --coordinator (the workers' rendezvous)");
  }
  return coordinator;
}

absl::StatusOr<Datasets> LoadData(const WorkerFlags& f) {
  Datasets d;
  if (const int64_t n = f.synthetic; n > 0) {
    const std::vector<int>& layers = f.trainer.model.mlp.layers;
    const int dim = layers.front(), classes = layers.back();
    const int64_t held_out = n / 5 + 1;  // one draw, split: the same class centroids
    data::Dataset all = data::MakeSynthetic(n + held_out, dim, classes, /*seed=*/7);
    auto take = [&](int64_t from, int64_t count) {
      data::Dataset part;
      part.size = count;
      part.dim = dim;
      part.classes = classes;
      part.x.assign(all.x.begin() + from * dim, all.x.begin() + (from + count) * dim);
      part.y.assign(all.y.begin() + from, all.y.begin() + from + count);
      return part;
    };
    d.train = take(0, n);
    d.test = take(n, held_out);
    return d;
  }
  if (f.trainer.model.name == "gpt") {
    ASSIGN_OR_RETURN(data::TextCorpus corpus, data::LoadFortunes(f.text_dir));
    const int context = f.trainer.model.gpt.context;
    ASSIGN_OR_RETURN(d.train, data::MakeLanguageModelData(corpus.train, context));
    ASSIGN_OR_RETURN(d.test, data::MakeLanguageModelData(corpus.held_out, context));
    LogInfo("worker %d: text %s: %zu training bytes (%lld windows of %d), %zu held out",
            f.trainer.rank, f.text_dir.c_str(), corpus.train.size(),
            static_cast<long long>(d.train.size), context, corpus.held_out.size());
    return d;
  }
  ASSIGN_OR_RETURN(d.train, data::LoadFashionMnist(f.dataset_dir, data::Split::kTrain));
  ASSIGN_OR_RETURN(d.test, data::LoadFashionMnist(f.dataset_dir, data::Split::kTest));
  return d;
}

absl::StatusOr<std::unique_ptr<compute::Backend>> MakeBackend(const WorkerFlags& f) {
  if (f.backend == "cpu") return compute::MakeCpuBackend(1);
  absl::StatusOr<std::unique_ptr<compute::Backend>> cuda =
      compute::MakeCudaBackend(CudaDevice(f.cuda_device, f.trainer.rank));
  if (!cuda.ok())
    return absl::Status(cuda.status().code(), "--backend=cuda: " + cuda.status().ToString());
  return cuda;
}

absl::Status WriteSummaryJson(const std::string& path, int rank, const std::string& mode,
                              const modes::TrainSummary& summary) {
  // A JSON library, not concatenation: a NaN loss is null (JSON has no NaN), a name is escaped.
  nlohmann::ordered_json switches = nlohmann::ordered_json::array();
  for (const modes::SwitchDone& s : summary.switches) {
    switches.push_back(
        {{"step", s.step}, {"from", s.from}, {"to", s.to}, {"handoff_seconds", s.seconds}});
  }
  nlohmann::ordered_json figures = nlohmann::ordered_json::object();
  for (const auto& [name, value] : summary.figures) figures[name] = value;
  const nlohmann::ordered_json json = {{"rank", rank},
                                       {"mode", mode},
                                       {"final_mode", summary.final_mode},
                                       {"model", summary.model},
                                       {"steps", summary.steps},
                                       {"epochs", summary.epochs},
                                       {"steps_per_epoch", summary.steps_per_epoch},
                                       {"final_loss", summary.final_loss},
                                       {"test_accuracy", summary.test_accuracy},
                                       {"test_loss", summary.test_loss},
                                       {"samples_per_sec", summary.samples_per_sec},
                                       {"train_seconds", summary.train_seconds},
                                       {"snapshots", summary.snapshots},
                                       {"rollbacks", summary.rollbacks},
                                       {"switches", switches},
                                       {"figures", figures},
                                       {"param_crc32c", summary.param_crc32c}};
  std::ofstream f(path);
  // A name that is not UTF-8 is written with U+FFFD instead of throwing.
  f << json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  if (!f) return absl::UnavailableError("cannot write --summary_json=" + path);
  return absl::OkStatus();
}

}  // namespace pscluster::worker
