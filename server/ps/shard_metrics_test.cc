// ps_server's metrics name each table by id and by name (issue 50: "table" held only the
// numeric id, which no dashboard reader can map to a model's tensor).
#include "server/ps/shard_metrics.h"

#include "common/testing/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::ps {
namespace {

using ::testing::HasSubstr;

TEST(ShardMetricsTest, TablesAreLabelledByIdAndName) {
  Shard shard(ShardOptions{0, 1});
  TableSpec spec;
  spec.set_table_id(7);
  spec.set_name("fc1.weight");
  spec.set_kind(TableSpec::DENSE);
  spec.set_size(16);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  ASSERT_TRUE(shard.CreateTable(spec).ok());
  auto metrics = Metrics::Serve("127.0.0.1", 0, "ps_server", "0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  AddShardMetrics(&shard, nullptr, metrics->get());
  const std::string text = testing::HttpGetBody((*metrics)->port(), "/metrics");
  EXPECT_THAT(text, HasSubstr("pscluster_ps_pushes_total{table=\"7\",table_name=\"fc1.weight\"}"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_table_rows{kind=\"dense\",table=\"7\","
                              "table_name=\"fc1.weight\"} 16"));
}

}  // namespace
}  // namespace pscluster::ps
