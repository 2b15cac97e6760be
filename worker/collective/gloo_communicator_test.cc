// Gloo communicators for N = 1..4 ranks as threads in one process (real TCP on loopback,
// in-memory rendezvous), payloads of 0, 1, odd and large sizes, expected values computed by
// formula; and a missing peer makes the others fail with a timeout that names it.
#include <signal.h>

#include <algorithm>
#include <array>
#include <functional>
#include <thread>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collective/communicator.h"

namespace pscluster::collective {
namespace {

// Rank r's value at index i: small integers, so float sums are exact in any order.
float Value(int r, size_t i) { return static_cast<float>((r + 1) * (i % 7 + 1)); }
float SumOverRanks(int n, size_t i) { return static_cast<float>((i % 7 + 1) * n * (n + 1) / 2); }

// Connects `n` ranks and runs fn(comm) on each, on its own thread; `spin`: GlooOptions'.
void OnRanks(int n, const std::function<void(Communicator&)>& fn,
             absl::Duration spin = GlooOptions().spin) {
  MemoryRendezvous store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options{r, n};
      options.spin = spin;
      auto comm = CreateGlooCommunicator(&store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

// (ranks, whether receives poll before they sleep)
class GlooCommunicatorTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Two ranks connected through `store`, each op bounded by `timeout`.
std::array<std::unique_ptr<Communicator>, 2> ConnectPair(Rendezvous* store,
                                                         absl::Duration timeout) {
  std::array<std::unique_ptr<Communicator>, 2> comms;
  std::thread t1([&] {
    GlooOptions options{1, 2};
    options.timeout = timeout;
    comms[1] = *CreateGlooCommunicator(store, options);
  });
  GlooOptions options{0, 2};
  options.timeout = timeout;
  comms[0] = *CreateGlooCommunicator(store, options);
  t1.join();
  return comms;
}

TEST_P(GlooCommunicatorTest, EveryCollectiveMatchesItsFormulaForEveryPayloadSize) {
  const auto [n, spin] = GetParam();
  OnRanks(
      n,
      [&](Communicator& c) {
        const int r = c.rank();
        EXPECT_EQ(c.size(), n);
        for (size_t len : {size_t{0}, size_t{1}, size_t{1001}, size_t{1} << 18}) {
          SCOPED_TRACE(testing::Message()
                       << "rank " << r << " of " << n << ", " << len << " floats");
          std::vector<float> data(len);
          for (size_t i = 0; i < len; ++i) data[i] = Value(r, i);
          ASSERT_TRUE(c.AllReduceSum(absl::MakeSpan(data)).ok());
          for (size_t i = 0; i < len; ++i)
            ASSERT_EQ(data[i], SumOverRanks(n, i)) << "all-reduce " << i;

          std::vector<float> blocks(len * n), mine(len);
          for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = Value(r, i);
          absl::Status s = c.ReduceScatterSum(blocks, absl::MakeSpan(mine));
          ASSERT_TRUE(s.ok()) << s;
          for (size_t i = 0; i < len; ++i)
            ASSERT_EQ(mine[i], SumOverRanks(n, r * len + i)) << "reduce-scatter";

          std::vector<float> own(len), all(len * n);
          for (size_t i = 0; i < len; ++i) own[i] = Value(r, i);
          ASSERT_TRUE(c.AllGather(own, absl::MakeSpan(all)).ok());
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < len; ++i)
              ASSERT_EQ(all[q * len + i], Value(q, i)) << "all-gather";
          }

          const int root = n - 1;
          std::vector<float> b(len, r == root ? 0.0f : -1.0f);
          for (size_t i = 0; i < len && r == root; ++i) b[i] = Value(root, i);
          ASSERT_TRUE(c.Broadcast(absl::MakeSpan(b), root).ok());
          for (size_t i = 0; i < len; ++i) ASSERT_EQ(b[i], Value(root, i)) << "broadcast";

          if (n > 1) {  // a ring of sends: each rank receives its predecessor's values
            std::vector<float> got(len);
            // A large Send waits for its receiver: rank 0 sends first, the others receive first.
            const int next = (r + 1) % n, prev = (r + n - 1) % n;
            if (r == 0) ASSERT_TRUE(c.Send(own, next, 7).ok());
            absl::Status recv = c.Recv(absl::MakeSpan(got), prev, 7);
            ASSERT_TRUE(recv.ok()) << recv;
            if (r != 0) ASSERT_TRUE(c.Send(own, next, 7).ok());
            for (size_t i = 0; i < len; ++i)
              ASSERT_EQ(got[i], Value((r + n - 1) % n, i)) << "send/recv";
            // Both directions at once from one thread (a pipeline stage's exchange): send to
            // the successor, receive from the predecessor.
            std::fill(got.begin(), got.end(), -1.0f);
            absl::Status sr =
                c.SendRecv(own, (r + 1) % n, 9, absl::MakeSpan(got), (r + n - 1) % n, 9);
            ASSERT_TRUE(sr.ok()) << sr;
            for (size_t i = 0; i < len; ++i)
              ASSERT_EQ(got[i], Value((r + n - 1) % n, i)) << "send-recv";
          }
          ASSERT_TRUE(c.Barrier().ok());
        }
      },
      spin ? GlooOptions().spin : absl::ZeroDuration());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCommunicatorTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()));

TEST(GlooCommunicatorErrorsTest, MissingPeerTimesOutNamingIt) {
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Milliseconds(300));
  std::vector<float> data(10);
  absl::Status s = comms[0]->Recv(absl::MakeSpan(data), 1, 3);  // rank 1 never sends
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("from rank 1"));
}

// A peer that is alive but never joins the all-reduce: the others time out, naming it.
TEST(GlooCommunicatorErrorsTest, HungPeerInAnAllReduceTimesOutNamingIt) {
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Milliseconds(300));
  std::vector<float> data(1000, 1.0f);
  absl::Status s = comms[0]->AllReduceSum(absl::MakeSpan(data));  // rank 1 never calls it
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("from rank 1")) << s;
}

// A peer that is alive but silent (a stopped process): the wait check between slices ends
// the wait with its reason (the coordinator declared the peer dead) instead of the timeout;
// while it says go on, the wait goes on, bounded by the timeout.
TEST(GlooCommunicatorErrorsTest, AWaitCheckEndsTheWaitForASilentPeer) {
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Seconds(60));
  int checks = 0;
  comms[0]->SetWaitCheck(
      [&checks] {
        return ++checks < 3 ? absl::OkStatus()
                            : absl::UnavailableError("worker rank 1 is down (test)");
      },
      absl::Milliseconds(50));
  std::vector<float> data(1000, 1.0f);
  absl::Status s = comms[0]->AllReduceSum(absl::MakeSpan(data));  // rank 1 never calls it
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(checks, 3);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("from rank 1")) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("worker rank 1 is down")) << s;
  // A check that always says go on: the timeout still ends the wait, as a timeout.
  MemoryRendezvous other;
  auto timed = ConnectPair(&other, absl::Milliseconds(300));
  timed[0]->SetWaitCheck([] { return absl::OkStatus(); }, absl::Milliseconds(50));
  s = timed[0]->Recv(absl::MakeSpan(data), 1, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// A peer that goes away in the middle of a large (synchronous ring) all-reduce: the
// survivor fails at once, naming the rank, instead of waiting out its timeout.
TEST(GlooCommunicatorErrorsTest, PeerGoneDuringARingAllReduceIsNamed) {
  signal(SIGPIPE, SIG_IGN);  // as ps_worker does: a write to a closed socket is an error
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Seconds(30));
  comms[1].reset();  // rank 1 leaves: its sockets close
  std::vector<float> data(1 << 18, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = comms[0]->AllReduceSum(absl::MakeSpan(data));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "waited for the timeout";
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("rank 1")) << s;
}

// A pipeline stage broadcasting (its parameters in Gather, the loss from the last stage)
// to a peer that went away: the survivor's error names the missing peer, not only itself.
TEST(GlooCommunicatorErrorsTest, PeerGoneDuringABroadcastFromTheSurvivorIsNamed) {
  signal(SIGPIPE, SIG_IGN);
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Seconds(30));
  comms[1].reset();  // rank 1 leaves: its sockets close
  std::vector<float> data(1 << 18, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = comms[0]->Broadcast(absl::MakeSpan(data), /*root=*/0);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "waited for the timeout";
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("sending to rank 1")) << s;
}

// Three ranks: the root's broadcast reaches rank 1 and fails only towards rank 2, which
// its error names (the survivors' own ranks are not the missing peer).
TEST(GlooCommunicatorErrorsTest, PeerGoneDuringABroadcastOfThreeIsTheOneNamed) {
  signal(SIGPIPE, SIG_IGN);
  MemoryRendezvous store;
  std::array<std::unique_ptr<Communicator>, 3> comms;
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { comms[r] = *CreateGlooCommunicator(&store, GlooOptions{r, 3}); });
  }
  for (auto& t : threads) t.join();
  comms[2].reset();
  std::vector<float> sent(1 << 18, 3.0f), got(1 << 18);
  absl::Status received;
  std::thread rank1([&] { received = comms[1]->Broadcast(absl::MakeSpan(got), 0); });
  absl::Status s = comms[0]->Broadcast(absl::MakeSpan(sent), 0);
  rank1.join();
  EXPECT_TRUE(received.ok()) << received;
  EXPECT_EQ(got.back(), 3.0f);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("sending to rank 2")) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("to rank 1"))) << s;
}

// The other side: the root went away; the survivor names it as the rank it waited for.
TEST(GlooCommunicatorErrorsTest, RootGoneDuringABroadcastIsNamed) {
  signal(SIGPIPE, SIG_IGN);
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Seconds(30));
  comms[0].reset();
  std::vector<float> data(1000);
  absl::Status s = comms[1]->Broadcast(absl::MakeSpan(data), /*root=*/0);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("from rank 0")) << s;
}

// Point-to-point messages received in another order than sent: an error that says so, at
// once, not a hang or a wrong buffer filled.
TEST(GlooCommunicatorErrorsTest, MessagesReceivedOutOfOrderAreAnError) {
  MemoryRendezvous store;
  auto comms = ConnectPair(&store, absl::Seconds(30));
  std::vector<float> first(8, 1.0f), second(8, 2.0f), got(8, 0.0f);
  ASSERT_TRUE(comms[0]->Send(first, 1, 1).ok());
  ASSERT_TRUE(comms[0]->Send(second, 1, 2).ok());
  absl::Status s = comms[1]->Recv(absl::MakeSpan(got), 0, 2);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("in the order they were sent")) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("from rank 0")) << s;
  EXPECT_EQ(got, std::vector<float>(8, 0.0f));
}

TEST(GlooCommunicatorErrorsTest, BadArgumentsAreInvalidArgument) {
  OnRanks(1, [](Communicator& c) {
    std::vector<float> x(4), y(3);
    EXPECT_EQ(c.ReduceScatterSum(x, absl::MakeSpan(y)).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.AllGather(x, absl::MakeSpan(y)).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(absl::MakeSpan(x), 3).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Send(x, 0, 1).code(), absl::StatusCode::kInvalidArgument);
  });
  OnRanks(2, [](Communicator& c) {
    std::vector<float> x(4);
    EXPECT_EQ(c.Send(x, 1 - c.rank(), -1).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Recv(absl::MakeSpan(x), 1 - c.rank(), 1 << 29).code(),
              absl::StatusCode::kInvalidArgument);
  });
  MemoryRendezvous store;
  EXPECT_EQ(CreateGlooCommunicator(&store, GlooOptions{2, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster::collective
