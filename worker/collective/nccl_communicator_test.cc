// NCCL communicators for N = 1, 2 ranks as threads in one process, one GPU each (NCCL
// refuses two ranks of one communicator on one GPU: "Duplicate GPU detected"), an in-memory
// rendezvous, payloads of 0, 1, odd and large sizes in device memory, expected values
// computed by formula; a missing peer times out naming it.
//
// Every test that needs GPUs skips, printing why, in a build without --config=cuda, where no
// GPU is usable, or where there are fewer GPUs than ranks.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#ifdef PSCLUSTER_NCCL
#include <cuda_runtime.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collective/nccl_communicator.h"

namespace pscluster::collective {
namespace {

using ::testing::HasSubstr;

// Why `ranks` ranks cannot run here, or "" where they can.
std::string GpuShortage(int ranks) {
#ifndef PSCLUSTER_NCCL
  return absl::StrCat("built without --config=cuda; ", ranks, " rank(s) need that many GPUs");
#else
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::StrCat("no usable GPU: cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                        cudaGetErrorString(e), ")");
  }
  if (count < ranks) {
    return absl::StrCat(ranks, " ranks need ", ranks,
                        " GPUs (NCCL refuses two ranks of one communicator on one GPU); ", count,
                        " visible");
  }
  return "";
#endif
}

#define SKIP_UNLESS_GPUS(ranks)                        \
  do {                                                 \
    const std::string why = GpuShortage(ranks);        \
    if (!why.empty()) {                                \
      std::printf("SKIPPED (GPU): %s\n", why.c_str()); \
      GTEST_SKIP() << why;                             \
    }                                                  \
  } while (0)

#ifdef PSCLUSTER_NCCL
// Floats in memory of the calling thread's current GPU, filled from the host.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    if (n_ == 0) return;
    EXPECT_EQ(cudaMalloc(&data_, n_ * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    // cudaMemcpy from pageable memory may return before the DMA lands; the communicator's
    // stream does not wait for it.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  absl::Span<float> span() { return absl::MakeSpan(data_, n_); }
  std::vector<float> ToHost() const {
    std::vector<float> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

 private:
  float* data_ = nullptr;
  const size_t n_;
};
#else
// Only so that the GPU tests compile without CUDA: they skip before they get here.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::vector<float> host) : host_(std::move(host)) {}
  absl::Span<float> span() { return absl::MakeSpan(host_); }
  std::vector<float> ToHost() const { return host_; }

 private:
  std::vector<float> host_;
};
#endif

// Rank r's value at index i: small integers, so float sums are exact in any order.
float Value(int r, size_t i) { return static_cast<float>((r + 1) * (i % 7 + 1)); }
float SumOverRanks(int n, size_t i) { return static_cast<float>((i % 7 + 1) * n * (n + 1) / 2); }
std::vector<float> Values(int r, size_t len) {
  std::vector<float> v(len);
  for (size_t i = 0; i < len; ++i) v[i] = Value(r, i);
  return v;
}

NcclOptions Options(int rank, int size, absl::Duration timeout) {
  NcclOptions o;
  o.rank = rank;
  o.size = size;
  o.device = rank;
  o.timeout = timeout;
  o.key_prefix = "test/";
  return o;
}

// Connects `n` ranks, rank r on GPU r, and runs fn(comm) on each, on its own thread.
void OnRanks(int n, absl::Duration timeout, const std::function<void(Communicator&)>& fn) {
  MemoryRendezvous store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
#ifdef PSCLUSTER_NCCL
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
#endif
      auto comm = CreateNcclCommunicator(&store, Options(r, n, timeout));
      ASSERT_TRUE(comm.ok()) << comm.status();
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

class NcclCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCommunicatorTest, EveryCollectiveMatchesItsFormulaForEveryPayloadSize) {
  const int n = GetParam();
  SKIP_UNLESS_GPUS(n);
  OnRanks(n, absl::Seconds(60), [&](Communicator& c) {
    const int r = c.rank();
    EXPECT_EQ(c.size(), n);
    for (size_t len : {size_t{0}, size_t{1}, size_t{1001}, size_t{1} << 18}) {
      SCOPED_TRACE(testing::Message() << "rank " << r << " of " << n << ", " << len << " floats");
      DeviceFloats data(Values(r, len));
      absl::Status s = c.AllReduceSum(data.span());
      ASSERT_TRUE(s.ok()) << s;
      std::vector<float> got = data.ToHost();
      for (size_t i = 0; i < len; ++i) ASSERT_EQ(got[i], SumOverRanks(n, i)) << "all-reduce " << i;

      DeviceFloats blocks(Values(r, len * n)), mine(std::vector<float>(len, -1.0f));
      s = c.ReduceScatterSum(blocks.span(), mine.span());
      ASSERT_TRUE(s.ok()) << s;
      got = mine.ToHost();
      for (size_t i = 0; i < len; ++i)
        ASSERT_EQ(got[i], SumOverRanks(n, r * len + i)) << "reduce-scatter " << i;

      DeviceFloats own(Values(r, len)), all(std::vector<float>(len * n, -1.0f));
      s = c.AllGather(own.span(), all.span());
      ASSERT_TRUE(s.ok()) << s;
      got = all.ToHost();
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < len; ++i)
          ASSERT_EQ(got[q * len + i], Value(q, i)) << "all-gather " << q << "." << i;
      }

      const int root = n - 1;
      DeviceFloats b(r == root ? Values(root, len) : std::vector<float>(len, -1.0f));
      s = c.Broadcast(b.span(), root);
      ASSERT_TRUE(s.ok()) << s;
      got = b.ToHost();
      for (size_t i = 0; i < len; ++i) ASSERT_EQ(got[i], Value(root, i)) << "broadcast " << i;

      if (n > 1) {  // a ring: rank 0 sends first, every other rank receives first
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        DeviceFloats in(std::vector<float>(len, -1.0f));
        if (r == 0) {
          s = c.Send(own.span(), next, 7);
          ASSERT_TRUE(s.ok()) << s;
        }
        s = c.Recv(in.span(), prev, 7);
        ASSERT_TRUE(s.ok()) << s;
        if (r != 0) {
          s = c.Send(own.span(), next, 7);
          ASSERT_TRUE(s.ok()) << s;
        }
        got = in.ToHost();
        for (size_t i = 0; i < len; ++i) ASSERT_EQ(got[i], Value(prev, i)) << "send/recv " << i;
        // Both directions at once (a pipeline stage's exchange): to the successor, from the
        // predecessor.
        DeviceFloats in2(std::vector<float>(len, -1.0f));
        s = c.SendRecv(own.span(), next, 9, in2.span(), prev, 9);
        ASSERT_TRUE(s.ok()) << s;
        got = in2.ToHost();
        for (size_t i = 0; i < len; ++i) ASSERT_EQ(got[i], Value(prev, i)) << "send-recv " << i;
      }
      s = c.Barrier();
      ASSERT_TRUE(s.ok()) << s;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclCommunicatorTest, ::testing::Values(1, 2));

TEST(NcclCommunicatorErrorsTest, MissingPeerTimesOutNamingItAndAbortsTheCommunicator) {
  SKIP_UNLESS_GPUS(2);
  absl::Notification rank0_done;
  OnRanks(2, absl::Seconds(10), [&](Communicator& c) {
    if (c.rank() == 1) {  // never sends; stays up until rank 0 has given up
      rank0_done.WaitForNotification();
      return;
    }
    DeviceFloats data(std::vector<float>(10));
    absl::Status s = c.Recv(data.span(), 1, 3);
    rank0_done.Notify();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("from rank 1"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank 1"));
    EXPECT_EQ(c.Barrier().code(), absl::StatusCode::kFailedPrecondition);
  });
}

TEST(NcclCommunicatorErrorsTest, ReceiveOfAnotherTagFailsNamingTheTagSent) {
  SKIP_UNLESS_GPUS(2);
  OnRanks(2, absl::Seconds(60), [&](Communicator& c) {
    DeviceFloats data(Values(c.rank(), 5));
    if (c.rank() == 0) {
      absl::Status s = c.Send(data.span(), 1, 11);
      EXPECT_TRUE(s.ok()) << s;
    } else {
      absl::Status s = c.Recv(data.span(), 0, 12);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("with tag 11"));
    }
    absl::Status s = c.Barrier();  // a tag mismatch leaves the communicator usable
    EXPECT_TRUE(s.ok()) << s;
  });
}

TEST(NcclCommunicatorErrorsTest, BadArgumentsAndHostBuffersAreInvalidArgument) {
  SKIP_UNLESS_GPUS(1);
  OnRanks(1, absl::Seconds(60), [](Communicator& c) {
    DeviceFloats x(std::vector<float>(4)), y(std::vector<float>(3));
    EXPECT_EQ(c.ReduceScatterSum(x.span(), y.span()).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.AllGather(x.span(), y.span()).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(x.span(), 3).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Send(x.span(), 0, 1).code(), absl::StatusCode::kInvalidArgument);
    std::vector<float> host(4);
    absl::Status s = c.AllReduceSum(absl::MakeSpan(host));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("host memory"));
    s = c.AllReduceSum(x.span());  // refused arguments do not abort the communicator
    EXPECT_TRUE(s.ok()) << s;
  });
}

TEST(NcclCommunicatorErrorsTest, RankWithoutUniqueIdTimesOutNamingTheKey) {
  SKIP_UNLESS_GPUS(1);
  MemoryRendezvous store;  // rank 0 never publishes
  NcclOptions o = Options(1, 2, absl::Milliseconds(200));
  o.device = 0;
  auto comm = CreateNcclCommunicator(&store, o);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 0's NCCL unique id"));
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("test/unique_id"));
}

TEST(NcclCommunicatorErrorsTest, UniqueIdOfTheWrongSizeIsInvalidArgument) {
  SKIP_UNLESS_GPUS(1);
  MemoryRendezvous store;
  ASSERT_TRUE(store.Put("test/unique_id", "abc").ok());
  NcclOptions o = Options(1, 2, absl::Seconds(5));
  o.device = 0;
  auto comm = CreateNcclCommunicator(&store, o);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("holds 3 bytes"));
}

#ifdef PSCLUSTER_NCCL
// Needs no GPU: options are checked before CUDA is touched.
TEST(NcclCommunicatorOptionsTest, BadOptionsAreInvalidArgument) {
  MemoryRendezvous store;
  EXPECT_EQ(CreateNcclCommunicator(&store, Options(2, 2, absl::Seconds(1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicator(&store, Options(0, 0, absl::Seconds(1))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicator(&store, Options(0, 1, absl::ZeroDuration())).status().code(),
            absl::StatusCode::kInvalidArgument);
  NcclOptions o = Options(0, 1, absl::Seconds(1));
  o.device = -1;
  EXPECT_EQ(CreateNcclCommunicator(&store, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicator(nullptr, Options(0, 1, absl::Seconds(1))).status().code(),
            absl::StatusCode::kInvalidArgument);
}
#else
TEST(NcclCommunicatorStubTest, WithoutCudaConfigCreateIsUnavailableSayingSo) {
  MemoryRendezvous store;
  auto comm = CreateNcclCommunicator(&store, NcclOptions{});
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("built without --config=cuda"));
}
#endif

}  // namespace
}  // namespace pscluster::collective
