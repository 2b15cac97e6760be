#include "common/logging.h"

#include <memory>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"

namespace pscluster {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitLoggingTo("ps_worker", "3", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_),
                  std::make_shared<spdlog::sinks::ostream_sink_mt>(err_));
  }
  void TearDown() override { InitLogging("logging_test", ""); }  // the sinks die with us

  std::ostringstream out_, err_;
};

TEST_F(LoggingTest, EveryLineHasTheTimeTheLevelTheRoleAndTheId) {
  LogInfo("worker %d: epoch %d test accuracy %.4f\n", 3, 2, 0.8512);
  EXPECT_THAT(out_.str(),
              ContainsRegex("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z I "
                            "ps_worker/3 worker 3: epoch 2 test accuracy 0\\.8512\n$"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(LoggingTest, WarningsAndErrorsGoToTheOtherStream) {
  LogWarning("coordinator %s unreachable; retrying", "127.0.0.1:4000");
  LogError("giving up");
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), ContainsRegex("Z W ps_worker/3 coordinator 127.0.0.1:4000 unreachable; "
                                        "retrying\n.*Z E ps_worker/3 giving up\n$"));
}

TEST_F(LoggingTest, BracesAndPercentsInAMessageOrTagAreText) {
  Log(LogLevel::kInfo, "a {} and 100% sure");
  InitLoggingTo("role%Y", "{0}", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_),
                std::make_shared<spdlog::sinks::ostream_sink_mt>(err_));
  LogInfo("%s", "x");
  EXPECT_THAT(out_.str(), HasSubstr(" I ps_worker/3 a {} and 100% sure\n"));
  EXPECT_THAT(out_.str(), HasSubstr(" I role%Y/{0} x\n"));
}

TEST_F(LoggingTest, GrpcsOwnLinesComeThroughInTheSameFormat) {
  grpc_init();  // gpr_log drops every line before gRPC reads its verbosity
  gpr_log(GPR_ERROR, "subchannel %d failed", 7);
  gpr_log(GPR_INFO, "a detail");
  EXPECT_THAT(err_.str(),
              ContainsRegex("Z E ps_worker/3 grpc: subchannel 7 failed \\(.*:[0-9]+\\)\n$"));
  // gRPC drops lines below its verbosity (GRPC_VERBOSITY, ERROR by default) before us.
  EXPECT_THAT(out_.str(), Not(HasSubstr("a detail")));
  grpc_shutdown();
}

}  // namespace
}  // namespace pscluster
