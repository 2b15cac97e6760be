// The memory a ps_server spends on requests in flight, against real processes: push streams
// beyond the shard's budget (--max_inflight_request_bytes) are refused with
// RESOURCE_EXHAUSTED naming the budget and the flag while the shard keeps serving and its
// state stays as it was; a burst of large refused requests keeps the resident size within
// the budget plus a fixed margin, and the memory goes back once the burst is over.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/ps/shard_stub.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "tests/ps_cluster_fixture.h"

namespace pscluster {
namespace {

using ps::DenseChunk;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kBudget = 32 * kMiB;
constexpr uint32_t kTable = 7;
constexpr uint64_t kSliceValues = 4 * kMiB;  // shard 0's slice: 16 MiB of floats, half the budget
constexpr uint64_t kChunkValues = kMiB / 4;  // 1 MiB chunks, as PsClient sends them
// What an idle shard keeps after giving memory back: up to 16 MiB free at the top of each of
// its 4 malloc arenas (ps_server's mallopt; malloc_trim does not release those), and about
// 2 MiB for each of the test's 16 connections that carried large requests (gRPC's buffers).
constexpr uint64_t kIdleSlack = 4 * 16 * kMiB + 16 * 2 * kMiB;
// At the peak, also fragments and what gRPC keeps per connection.
constexpr uint64_t kHeapSlack = 128 * kMiB;
// ps_server's gRPC resource quota: 64 threads times a message (1 MiB + 64 KiB), over kBudget.
constexpr uint64_t kGrpcQuota = 64 * (kMiB + 64 * 1024);

// VmRSS of `pid`, in bytes.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

DenseChunk Chunk(uint64_t begin, uint64_t offset, uint64_t total, uint64_t n, int64_t step = 0) {
  DenseChunk c;
  c.set_worker_id(0);
  c.set_step(step);
  c.set_table_id(kTable);
  c.set_begin(begin);
  c.set_offset(offset);
  c.set_total_length(total);
  c.mutable_data()->assign(n * sizeof(float), '\0');  // zero gradients: finite
  return c;
}

// A push stream to shard 0 declaring `total` values from 0, sent in 1 MiB chunks in order.
class PushStream {
 public:
  PushStream(pscluster::ShardStub* stub, uint64_t total) : total_(total) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    ctx_.set_wait_for_ready(true);  // a connection refused under load is retried
    writer_ = stub->PushDenseStream(&ctx_, &resp_);
  }
  // Sends chunks up to `values` sent in all; false once the server ended the stream.
  bool SendUpTo(uint64_t values) {
    for (; sent_ < values; sent_ += kChunkValues) {
      if (!writer_->Write(Chunk(0, sent_, total_, std::min(kChunkValues, values - sent_)))) {
        return false;
      }
    }
    return true;
  }
  grpc::Status Finish() {
    writer_->WritesDone();
    return writer_->Finish();
  }
  // The server's answer without closing the stream: waits until the server ends it (bounded
  // by the stream's deadline).
  grpc::Status AwaitEnd() { return writer_->Finish(); }

 private:
  const uint64_t total_;
  uint64_t sent_ = 0;
  grpc::ClientContext ctx_;
  ps::PushDenseResponse resp_;
  std::unique_ptr<grpc::ClientWriter<DenseChunk>> writer_;
};

class RequestMemoryTest : public PsClusterTest {
 protected:
  std::vector<std::string> ServerArgs() override {
    // 1 MiB messages: gRPC's quota (the budget, or a message per handler thread) is 68 MiB.
    return {absl::StrCat("--max_inflight_request_bytes=", kBudget),
            absl::StrCat("--max_chunk_bytes=", kChunkValues * sizeof(float))};
  }

  void SetUp() override {
    PsClusterTest::SetUp();
    if (HasFatalFailure()) return;
    ps::TableSpec spec;
    spec.set_table_id(kTable);
    spec.set_kind(ps::TableSpec::DENSE);
    spec.set_size(2 * kSliceValues);  // shard 0 holds [0, kSliceValues)
    spec.mutable_optimizer()->set_learning_rate(0.5f);
    spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);  // a push would apply
    spec.mutable_initializer()->set_kind(ps::InitializerConfig::UNIFORM);
    spec.mutable_initializer()->set_scale(1.0f);
    ASSERT_TRUE(clients_[0]->CreateTable(spec).ok());
    before_ = Values();
    ASSERT_EQ(before_.size(), 2 * kSliceValues);
    // Connections of their own (a local subchannel pool), as separate workers would have,
    // and no client-side limit on what they send.
    for (int i = 0; i < kConnections; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetMaxSendMessageSize(-1);
      stubs_.push_back(pscluster::ShardStub::New(
          grpc::CreateCustomChannel(addresses_[0], grpc::InsecureChannelCredentials(), args)));
      grpc::ClientContext ctx;  // connected before the test starts
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      ps::StatsResponse stats;
      ASSERT_TRUE(stubs_.back()->Stats(&ctx, ps::StatsRequest(), &stats).ok());
    }
  }

  void TearDown() override {
    if (!HasFatalFailure()) {
      EXPECT_TRUE(Values() == before_) << "a refused push changed the table";
      auto stats = clients_[0]->Stats();
      EXPECT_TRUE(stats.ok()) << "a server stopped serving: " << stats.status();
    }
    PsClusterTest::TearDown();
  }

  std::vector<float> Values() {
    std::vector<float> out(2 * kSliceValues);
    absl::Status s = clients_[0]->PullDense(kTable, 0, absl::MakeSpan(out));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // A whole, valid push of shard 0's slice: applied unless refused.
  grpc::Status FullPush(pscluster::ShardStub* stub) {
    PushStream p(stub, kSliceValues);
    p.SendUpTo(kSliceValues);
    return p.Finish();
  }

  // A push stream that is refused whatever happens: it declares one chunk more than it
  // sends (INVALID_ARGUMENT, truncated) unless the budget refuses it first.
  grpc::Status TruncatedPush(pscluster::ShardStub* stub, uint64_t values) {
    PushStream p(stub, values + kChunkValues);
    p.SendUpTo(values);
    return p.Finish();
  }

  static void ExpectBudgetError(const grpc::Status& s) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr(absl::StrCat("in-flight request budget of ", kBudget, " bytes")));
    EXPECT_THAT(s.error_message(), HasSubstr("--max_inflight_request_bytes"));
  }

  static constexpr int kConnections = 16;
  std::vector<float> before_;
  std::vector<std::unique_ptr<pscluster::ShardStub>> stubs_;
};

TEST_F(RequestMemoryTest, StreamsBeyondTheBudgetAreRefusedNamingIt) {
  // Two streams of half the budget each, held open one chunk short of their end: between
  // them they hold the whole budget until they are closed.
  std::vector<std::unique_ptr<PushStream>> holders;
  for (int i = 0; i < 2; ++i) {
    holders.push_back(std::make_unique<PushStream>(stubs_[i].get(), kSliceValues));
    ASSERT_TRUE(holders.back()->SendUpTo(kSliceValues - kChunkValues));
  }
  // Once the shard has charged both (a truncated probe of one chunk is then refused by the
  // budget rather than for its length) ...
  grpc::Status probe;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    probe = TruncatedPush(stubs_[2].get(), kChunkValues);
    if (probe.error_message().find("budget") != std::string::npos) break;
    ASSERT_EQ(probe.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << probe.error_message();
    absl::SleepFor(absl::Milliseconds(20));
  }
  ExpectBudgetError(probe);
  // ... every valid push of the slice, however many at once, is refused and applies nothing.
  std::vector<grpc::Status> refused(8);
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < refused.size(); ++i) {
      threads.emplace_back([&, i] { refused[i] = FullPush(stubs_[3 + i].get()); });
    }
    for (auto& t : threads) t.join();
  }
  for (const grpc::Status& s : refused) ExpectBudgetError(s);
  // Meanwhile the shard serves the rest: pulls, statistics.
  EXPECT_TRUE(Values() == before_);
  EXPECT_TRUE(clients_[1]->Stats().ok());
  // Closing the holders (truncated: refused) gives their bytes back: a push of half the
  // budget is judged on its contents again.
  for (auto& h : holders) {
    grpc::Status s = h->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("truncated"));
  }
  grpc::Status after = TruncatedPush(stubs_[2].get(), kSliceValues - kChunkValues);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << after.error_message();
  EXPECT_THAT(after.error_message(), HasSubstr("truncated"));
}

// A stream's bytes are free by the time its client has the answer: a client that pushes
// again at once is judged on its push, not refused by the budget its last stream held. (The
// bytes used to go back only once gRPC had destroyed the call, after the answer; a client
// quick enough was refused, as one CI run was.)
TEST_F(RequestMemoryTest, AStreamsBytesAreFreeOnceItsAnswerArrives) {
  for (int round = 0; round < 50; ++round) {
    // Two streams that each declare half the budget (charged at their first chunk), ended
    // one chunk in: each is refused as truncated, and then holds nothing.
    for (int i = 0; i < 2; ++i) {
      PushStream p(stubs_[i].get(), kSliceValues);
      ASSERT_TRUE(p.SendUpTo(kChunkValues));
      grpc::Status s = p.Finish();
      ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    }
    grpc::Status next = TruncatedPush(stubs_[2].get(), kChunkValues);
    ASSERT_THAT(next.error_message(), HasSubstr("truncated")) << "round " << round;
  }
}

// Streams that stall mid-transfer (a client that sends part of a push, then nothing, with no
// deadline of its own) are cancelled once idle for --stream_idle_timeout: the budget they
// held goes back and a valid push is taken again. Before, two such streams held the budget
// until the client went away.
class StalledStreamTest : public RequestMemoryTest {
 protected:
  std::vector<std::string> ServerArgs() override {
    std::vector<std::string> args = RequestMemoryTest::ServerArgs();
    args.push_back("--stream_idle_timeout=1s");
    return args;
  }
};

TEST_F(StalledStreamTest, AStalledStreamIsCancelledAndItsBudgetFreed) {
  std::vector<std::unique_ptr<PushStream>> stalled;
  for (int i = 0; i < 2; ++i) {
    stalled.push_back(std::make_unique<PushStream>(stubs_[i].get(), kSliceValues));
    ASSERT_TRUE(stalled.back()->SendUpTo(kSliceValues - kChunkValues));
  }
  grpc::Status pushed;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    if ((pushed = FullPush(stubs_[2].get())).ok()) break;
    ExpectBudgetError(pushed);  // while the stalled ones hold it
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(pushed.ok()) << "the stalled streams still hold the budget: "
                           << pushed.error_message();
  // Each is ended by the shard, not by the client (closing one not yet idle for the timeout
  // would have it refused as truncated instead).
  for (auto& s : stalled) EXPECT_EQ(s->AwaitEnd().error_code(), grpc::StatusCode::CANCELLED);
}

// A stream that sent all its data but never said it was done is cancelled as idle too, and
// then applies nothing (before, the data went in although the client heard CANCELLED, and a
// client retrying under ASP would apply it twice).
TEST_F(StalledStreamTest, AStreamCancelledAfterAllItsDataAppliesNothing) {
  auto pushes = [&] {
    auto stats = clients_[0]->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    for (const ps::TableStats& t : (*stats)[0].tables()) {
      if (t.info().spec().table_id() == kTable) return t.pushes();
    }
    return uint64_t{0};
  };
  const uint64_t before = pushes();
  PushStream whole(stubs_[0].get(), kSliceValues);
  ASSERT_TRUE(whole.SendUpTo(kSliceValues));  // every value, but no WritesDone
  ASSERT_TRUE(
      servers_[0].WaitForLine("received nothing for 1s: cancelled", absl::Seconds(30)).ok());
  EXPECT_EQ(whole.AwaitEnd().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(pushes(), before) << "the cancelled stream's push was applied";
}

TEST_F(RequestMemoryTest, ImportOrExportOfAStateOverTheBudgetIsRefused) {
  // Adam: values and two slots, 48 MiB on shard 0: more than the whole budget.
  ps::TableSpec spec;
  spec.set_table_id(kTable + 1);
  spec.set_kind(ps::TableSpec::DENSE);
  spec.set_size(2 * kSliceValues);
  spec.mutable_optimizer()->set_kind(ps::OptimizerConfig::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.01f);
  ASSERT_TRUE(clients_[0]->CreateTable(spec).ok());
  {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ps::ImportDenseResponse resp;
    auto writer = stubs_[0]->ImportDense(&ctx, &resp);
    ps::TableStateChunk c;
    c.set_table_id(kTable + 1);
    c.set_num_slots(2);
    c.mutable_values()->Resize(1000, 0.0f);
    c.mutable_slots()->Resize(2000, 0.0f);
    writer->Write(c);
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    ExpectBudgetError(s);
    EXPECT_THAT(s.error_message(), HasSubstr("import of table 8"));
    EXPECT_THAT(s.error_message(), HasSubstr("nothing was imported"));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ps::ExportDenseRequest req;
    req.set_table_id(kTable + 1);
    auto reader = stubs_[0]->ExportDense(&ctx, req);
    ps::TableStateChunk c;
    EXPECT_FALSE(reader->Read(&c));
    grpc::Status s = reader->Finish();
    ExpectBudgetError(s);
    EXPECT_THAT(s.error_message(), HasSubstr("export of table 8"));
  }
  std::vector<float> values(2 * kSliceValues, 1.0f);
  ASSERT_TRUE(clients_[0]->PullDense(kTable + 1, 0, absl::MakeSpan(values)).ok());
  EXPECT_EQ(values, std::vector<float>(2 * kSliceValues, 0.0f)) << "the import changed it";
}

TEST_F(RequestMemoryTest, ABurstOfLargeRefusedRequestsStaysWithinTheBudgetAndFallsBack) {
  const pid_t pid = servers_[0].pid();
  absl::SleepFor(absl::Milliseconds(500));
  const uint64_t baseline = ResidentBytes(pid);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> peak{baseline};
  std::thread sampler([&] {
    while (!done) {
      uint64_t now = ResidentBytes(pid);
      if (now > peak) peak = now;
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  // Rounds of 16 concurrent requests, each a few MB, every one refused: streams of the whole
  // slice, truncated (refused for their length or by the budget), and unary pushes over the
  // message limit (refused by gRPC).
  int budget_refusals = 0;
  absl::Mutex mu;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < kConnections; ++i) {
      threads.emplace_back([&, i] {
        grpc::Status s;
        if (i % 4 == 3) {
          grpc::ClientContext ctx;
          ctx.set_wait_for_ready(true);
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
          ps::PushDenseResponse r;
          s = stubs_[i]->PushDense(&ctx, Chunk(0, 0, 2 * kMiB, 2 * kMiB), &r);  // 8 MiB
        } else {
          s = TruncatedPush(stubs_[i].get(), kSliceValues - kChunkValues);
        }
        EXPECT_FALSE(s.ok());
        absl::MutexLock lock(&mu);
        if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
            s.error_message().find("in-flight request budget") != std::string::npos) {
          ++budget_refusals;
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  done = true;
  sampler.join();
  // What the requests held (the budget), what gRPC buffered for them (its quota), recycled
  // buffers (a quarter of the budget), and heap slack. Without the budget and
  // with glibc keeping freed buffers, the same burst took this shard to over 500 MiB.
  EXPECT_LE(peak - baseline, kBudget + kGrpcQuota + kBudget / 4 + kHeapSlack)
      << "resident " << baseline / kMiB << " MiB before, " << peak / kMiB << " MiB at peak";
  // Once the shard has been idle for 2 s it gives back what the burst added, but for the
  // slack of an idle shard. (It used to keep all of it.)
  uint64_t now = 0;
  for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;) {
    now = ResidentBytes(pid);
    if (now <= baseline + kIdleSlack) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_LE(now, baseline + kIdleSlack)
      << "resident " << baseline / kMiB << " MiB before, " << peak / kMiB << " MiB at peak, "
      << now / kMiB << " MiB 30 s after";
  std::printf("resident %lu MiB before, %lu MiB at peak, %lu MiB after; %d budget refusals\n",
              static_cast<unsigned long>(baseline / kMiB), static_cast<unsigned long>(peak / kMiB),
              static_cast<unsigned long>(now / kMiB), budget_refusals);
}

}  // namespace
}  // namespace pscluster
