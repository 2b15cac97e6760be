// The staging communicator (host spans in front of backend buffers; NCCL's path with the
// CUDA backend) over Gloo and the CPU backend: every operation gives the formula's values,
// for 2 ranks and payloads of 0, 1, 1001 and 262144 floats.
#include "worker/collective/staging_communicator.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster::collective {
namespace {

float Value(int r, size_t i) { return static_cast<float>((r + 1) * (i % 7 + 1)); }

TEST(StagingCommunicatorTest, EveryOperationMatchesItsFormulaThroughTheStaging) {
  constexpr int n = 2;
  MemoryRendezvous store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto gloo = CreateGlooCommunicator(&store, GlooOptions{r, n});
      ASSERT_TRUE(gloo.ok()) << gloo.status();
      auto c = MakeStagingCommunicator(*std::move(gloo), compute::MakeCpuBackend(1));
      ASSERT_EQ(c->rank(), r);
      for (size_t len : {size_t{0}, size_t{1}, size_t{1001}, size_t{1} << 18}) {
        SCOPED_TRACE(testing::Message() << "rank " << r << ", " << len << " floats");
        std::vector<float> own(len), data(len), all(len * n), mine(len), got(len);
        for (size_t i = 0; i < len; ++i) own[i] = data[i] = Value(r, i);
        ASSERT_TRUE(c->AllReduceSum(absl::MakeSpan(data)).ok());
        for (size_t i = 0; i < len; ++i) ASSERT_EQ(data[i], Value(0, i) + Value(1, i));
        ASSERT_TRUE(c->AllGather(own, absl::MakeSpan(all)).ok());
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < len; ++i) ASSERT_EQ(all[q * len + i], Value(q, i));
        }
        std::vector<float> blocks(len * n);
        for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = Value(r, i);
        ASSERT_TRUE(c->ReduceScatterSum(blocks, absl::MakeSpan(mine)).ok());
        for (size_t i = 0; i < len; ++i) {
          ASSERT_EQ(mine[i], Value(0, r * len + i) + Value(1, r * len + i));
        }
        std::vector<float> b = r == 1 ? own : std::vector<float>(len, -1.0f);
        ASSERT_TRUE(c->Broadcast(absl::MakeSpan(b), 1).ok());
        for (size_t i = 0; i < len; ++i) ASSERT_EQ(b[i], Value(1, i));
        absl::Status s = c->SendRecv(own, 1 - r, 5, absl::MakeSpan(got), 1 - r, 5);
        ASSERT_TRUE(s.ok()) << s;
        for (size_t i = 0; i < len; ++i) ASSERT_EQ(got[i], Value(1 - r, i));
        ASSERT_TRUE(c->Barrier().ok());
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace pscluster::collective
