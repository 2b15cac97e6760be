// The cluster's rendezvous, on a real coordinator service (on loopback, in this process):
// three ranks meet through it and all-reduce over Gloo, and a value one rank puts is what
// another waits for (NCCL's unique id).
#include "worker/collective/coordinator_rendezvous.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator/service.h"
#include "worker/collective/communicator.h"

namespace pscluster::collective {
namespace {

// A coordinator service for `workers` workers (one shard expected) on a free loopback port.
struct Coordinator {
  explicit Coordinator(int workers) : cluster(coord::ClusterStateOptions{1, workers}) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Coordinator() { server->Shutdown(); }

  coord::ClusterState cluster;
  coord::KvStore kv;
  coord::CoordinatorService service{&cluster, &kv, absl::Minutes(1)};
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(CoordinatorRendezvousTest, RanksMeetThroughTheCoordinatorAndAllReduce) {
  constexpr int kRanks = 3;
  Coordinator coordinator(kRanks);
  ASSERT_NE(coordinator.port, 0);

  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      CoordinatorClientOptions o;
      o.coordinator = absl::StrCat("127.0.0.1:", coordinator.port);
      o.role = coord::WORKER;
      o.id = r;
      o.address = absl::StrCat("rank-", r);
      auto client = CoordinatorClient::Register(o);
      ASSERT_TRUE(client.ok()) << client.status();
      CoordinatorRendezvous rendezvous(client->get());
      GlooOptions options{r, kRanks};
      options.key_prefix = "allreduce/1/";
      auto comm = CreateGlooCommunicator(&rendezvous, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> x(1001, static_cast<float>(r + 1));
      ASSERT_TRUE((*comm)->AllReduceSum(absl::MakeSpan(x)).ok());
      for (float v : x) ASSERT_EQ(v, 6.0f);
    });
  }
  for (auto& t : threads) t.join();
}

// A value put by one rank is what another waits for.
TEST(CoordinatorRendezvousTest, WaitGetWaitsForTheValueAnotherRankPuts) {
  Coordinator coordinator(2);
  ASSERT_NE(coordinator.port, 0);
  std::unique_ptr<CoordinatorClient> clients[2];
  for (int r = 0; r < 2; ++r) {
    CoordinatorClientOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", coordinator.port);
    o.role = coord::WORKER;
    o.id = r;
    auto c = CoordinatorClient::Register(o);
    ASSERT_TRUE(c.ok()) << c.status();
    clients[r] = *std::move(c);
  }
  std::string got;
  std::thread waiter([&] {
    CoordinatorRendezvous kv1(clients[1].get());
    auto v = kv1.WaitGet("nccl/g1/unique_id", absl::Seconds(30));
    ASSERT_TRUE(v.ok()) << v.status();
    got = *v;
  });
  CoordinatorRendezvous kv0(clients[0].get());
  const std::string id(128, '\x07');  // an ncclUniqueId's size, bytes that are not text
  ASSERT_TRUE(kv0.Put("nccl/g1/unique_id", id).ok());
  waiter.join();
  EXPECT_EQ(got, id);
  EXPECT_EQ(kv0.WaitGet("nccl/absent", absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  clients[0].reset();
  clients[1].reset();
}

}  // namespace
}  // namespace pscluster::collective
