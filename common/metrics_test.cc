#include "common/metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/http_get.h"
#include "common/testing/idle_connections.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(int port) { return testing::HttpGetBody(port, "/metrics"); }

// Slowloris (issue 49): with 24 connections each holding half a request head, an honest
// scrape is answered while they all still hang, not once the server has timed them out.
TEST(MetricsTest, AScrapeIsAnsweredWhileIdleConnectionsHang) {
  auto metrics = Metrics::Serve("127.0.0.1", 0, "ps_server", "1");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const std::vector<int> idle = testing::OpenHalfRequests((*metrics)->port(), 24);
  ASSERT_EQ(idle.size(), 24u);
  EXPECT_THAT(Scrape((*metrics)->port()), HasSubstr("pscluster_info"));
  int open = 0;
  for (int fd : idle) open += testing::StillOpen(fd) ? 1 : 0;
  EXPECT_EQ(open, 24) << "the scrape was answered only after the server dropped idle connections";
  for (int fd : idle) close(fd);
}

TEST(MetricsTest, ServesInfoRpcsAndCollectedFamilies) {
  auto metrics = Metrics::Serve("127.0.0.1", 0, "ps_server", "1");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_GT((*metrics)->port(), 0);
  (*metrics)->rpcs().Record("/pscluster.ps.ShardData/PullDense", grpc::StatusCode::OK, 0.002);
  (*metrics)->rpcs().Record("/pscluster.ps.ShardData/PullDense", grpc::StatusCode::OK, 0.003);
  (*metrics)->rpcs().Record("/pscluster.ps.ShardData/PushDense", grpc::StatusCode::INVALID_ARGUMENT,
                            0.001);
  int scrapes = 0;
  (*metrics)->AddCollector([&scrapes](MetricFamilies* f) {
    ++scrapes;
    f->Gauge("pscluster_ps_table_values", "Values.", {{"table", "3"}}, 42);
    f->Summary("pscluster_ps_pull_wait_seconds", "Waits.", {{"table", "3"}}, 5, 1.5);
  });
  const std::string text = Scrape((*metrics)->port());
  EXPECT_EQ(scrapes, 1) << "collectors run once per scrape";
  // The role in the coordinator's words (its families say role="shard" too).
  EXPECT_THAT(text, HasSubstr("pscluster_info{id=\"1\",process=\"ps_server\",role=\"shard\","
                              "version=\""));
  EXPECT_THAT(text, HasSubstr("pscluster_rpc_server_handled_total{grpc_code=\"OK\",grpc_method="
                              "\"PullDense\",grpc_service=\"pscluster.ps.ShardData\"} 2"));
  EXPECT_THAT(text, HasSubstr("grpc_code=\"INVALID_ARGUMENT\",grpc_method=\"PushDense\""));
  EXPECT_THAT(text, HasSubstr("pscluster_rpc_server_handling_seconds_count{grpc_method="
                              "\"PullDense\",grpc_service=\"pscluster.ps.ShardData\"} 2"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_table_values{table=\"3\"} 42"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_pull_wait_seconds_count{table=\"3\"} 5"));
  // The standard process metrics, under the names every exporter uses.
  EXPECT_THAT(text, HasSubstr("# TYPE process_resident_memory_bytes gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_start_time_seconds gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_open_fds gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE process_max_fds gauge"));
  EXPECT_THAT(text, Not(HasSubstr("pscluster_process_")));
}

TEST(MetricsTest, MethodLabelsStayBoundedWhateverClientsCall) {
  auto metrics = Metrics::Serve("127.0.0.1", 0, "ps_coordinator", "");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  for (int i = 0; i < 200; ++i) {
    (*metrics)->rpcs().Record(absl::StrCat("/svc/M", i), grpc::StatusCode::UNIMPLEMENTED, 0);
  }
  (*metrics)->rpcs().Record("no slash", grpc::StatusCode::OK, 0);
  const std::string text = Scrape((*metrics)->port());
  EXPECT_THAT(text, HasSubstr("grpc_method=\"M63\""));
  EXPECT_THAT(text, Not(HasSubstr("grpc_method=\"M64\"")));
  EXPECT_THAT(text, HasSubstr("grpc_code=\"UNIMPLEMENTED\",grpc_method=\"other\",grpc_service="
                              "\"other\"} 136"));
}

TEST(MetricsTest, APortInUseIsAClearError) {
  auto first = Metrics::Serve("127.0.0.1", 0, "ps_server", "0");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Metrics::Serve("127.0.0.1", (*first)->port(), "ps_server", "1");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("cannot serve metrics on"));
}

}  // namespace
}  // namespace pscluster
