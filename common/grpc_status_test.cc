#include "common/grpc_status.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

TEST(GrpcStatusTest, GrpcsOwnRefusalsSayWhatToDo) {
  absl::Status busy = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(kThreadpoolExhausted)),
      "shard 1");
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(busy.message(), HasSubstr("shard 1: Server Threadpool Exhausted"));
  EXPECT_THAT(busy.message(), HasSubstr("--threads"));
  absl::Status big = FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                                 "Received message larger than max (5 vs. 4)"));
  EXPECT_THAT(big.message(), HasSubstr("--max_chunk_bytes"));
  EXPECT_THAT(big.message(), HasSubstr("max_message_bytes"));
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "x"), "c").message(), "c: x");
}

}  // namespace
}  // namespace pscluster
