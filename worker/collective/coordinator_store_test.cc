// Three ranks rendezvous through a real coordinator service (on loopback, in this
// process) and all-reduce over Gloo.
#include "worker/collective/coordinator_store.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/coordinator/service.h"
#include "worker/collective/communicator.h"

namespace pscluster::collective {
namespace {

TEST(CoordinatorStoreTest, RanksRendezvousThroughTheCoordinatorAndAllReduce) {
  constexpr int kRanks = 3;
  coord::Membership membership(coord::MembershipOptions{1, kRanks});
  coord::KvStore kv;
  coord::CoordinatorService service(&membership, &kv, absl::Minutes(1));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_NE(port, 0);

  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      CoordinatorClientOptions o;
      o.coordinator = absl::StrCat("127.0.0.1:", port);
      o.role = coord::WORKER;
      o.id = r;
      o.address = absl::StrCat("rank-", r);
      auto client = CoordinatorClient::Register(o);
      ASSERT_TRUE(client.ok()) << client.status();
      CoordinatorStore store(client->get(), "allreduce/1/", absl::Seconds(30));
      auto comm = CreateGlooCommunicator(&store, GlooOptions{r, kRanks});
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> x(1001, static_cast<float>(r + 1));
      ASSERT_TRUE((*comm)->AllReduceSum(absl::MakeSpan(x)).ok());
      for (float v : x) ASSERT_EQ(v, 6.0f);
    });
  }
  for (auto& t : threads) t.join();
  server->Shutdown();
}

}  // namespace
}  // namespace pscluster::collective
