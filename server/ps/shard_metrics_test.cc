// ps_server's metrics name each table by id and by name (issue 50: "table" held only the
// numeric id, which no dashboard reader can map to a model's tensor).
#include "server/ps/shard_metrics.h"

#include <cstdlib>

#include "common/testing/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::ps {
namespace {

using ::testing::HasSubstr;

TableSpec SgdSpec(uint32_t id, const std::string& name, TableSpec::Kind kind) {
  TableSpec spec;
  spec.set_table_id(id);
  spec.set_name(name);
  spec.set_kind(kind);
  spec.mutable_optimizer()->set_kind(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  return spec;
}

// The shard's metrics page, as a scrape reads it.
std::string Scrape(Shard* shard) {
  auto metrics = Metrics::Serve("127.0.0.1", 0, "ps_server", "0");
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  if (!metrics.ok()) return "";
  AddShardMetrics(shard, nullptr, metrics->get());
  return testing::HttpGetBody((*metrics)->port(), "/metrics");
}

TEST(ShardMetricsTest, TablesAreLabelledByIdAndName) {
  Shard shard(ShardOptions{0, 1});
  TableSpec spec = SgdSpec(7, "fc1.weight", TableSpec::DENSE);
  spec.set_size(16);
  ASSERT_TRUE(shard.CreateTable(spec).ok());
  const std::string text = Scrape(&shard);
  EXPECT_THAT(text, HasSubstr("pscluster_ps_pushes_total{table=\"7\",table_name=\"fc1.weight\"}"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_table_rows{kind=\"dense\",table=\"7\","
                              "table_name=\"fc1.weight\"} 16"));
}

// A sparse table's SparseRowPolicy counts what it let in, kept out and swept (issue 46).
TEST(ShardMetricsTest, SparseTablesCountAdmissionAndEviction) {
  Shard shard(ShardOptions{0, 1});
  TableSpec spec = SgdSpec(3, "emb", TableSpec::SPARSE);
  spec.set_dim(2);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  spec.mutable_rows()->set_admit_after_pushes(2);
  spec.mutable_rows()->set_evict_after_steps(1);  // a sweep every step
  ASSERT_TRUE(shard.CreateTable(spec).ok());
  auto table = shard.GetTable(3);
  ASSERT_TRUE(table.ok());
  auto* sparse = static_cast<SparseTable*>(*table);
  const std::vector<float> grad = {1.0f, 1.0f};
  bool skipped = false;
  for (int64_t step = 0; step < 3; ++step) {  // admitted at step 1, swept at step 2
    const uint64_t key = step < 2 ? 5 : 6;
    ASSERT_TRUE(sparse->Push(0, step, {key}, grad, &skipped).ok());
  }
  auto metrics = Metrics::Serve("127.0.0.1", 0, "ps_server", "0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  AddShardMetrics(&shard, nullptr, metrics->get());
  const std::string text = testing::HttpGetBody((*metrics)->port(), "/metrics");
  EXPECT_THAT(text,
              HasSubstr("pscluster_ps_rows_admitted_total{table=\"3\",table_name=\"emb\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("pscluster_ps_rows_not_admitted_total{table=\"3\",table_name=\"emb\"} 2"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_rows_evicted_total{table=\"3\",table_name=\"emb\"} 1"));
}

// A shard with a disk tier says where its sparse rows are and how often RAM held them.
TEST(ShardMetricsTest, ADiskTierReportsItsRowsAndItsHitRate) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  auto tier = DiskTier::Open({std::string(tmp != nullptr ? tmp : "/tmp") + "/metrics_tier",
                              /*memory_bytes=*/1, /*reserve_bytes=*/1 << 20});
  ASSERT_TRUE(tier.ok()) << tier.status();
  ShardOptions options{0, 1};
  options.disk_tier = tier->get();
  Shard shard(options);
  TableSpec spec = SgdSpec(3, "emb", TableSpec::SPARSE);
  spec.set_dim(2);
  spec.mutable_consistency()->set_mode(ConsistencyConfig::ASP);
  ASSERT_TRUE(shard.CreateTable(spec).ok());
  auto* sparse = static_cast<SparseTable*>(*shard.GetTable(3));
  const std::vector<float> grad = {1.0f, 1.0f};
  bool skipped = false;
  // Key 5's row goes to disk when key 6 comes (a budget of one byte), and back at step 2.
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(sparse->Push(0, step, {step == 1 ? 6u : 5u}, grad, &skipped).ok());
  }
  std::vector<float> out(2);
  ASSERT_TRUE(sparse->Read({6}, absl::MakeSpan(out)).ok());  // on disk now: key 5 needed room
  const std::string text = Scrape(&shard);
  EXPECT_THAT(text, HasSubstr("pscluster_ps_rows_on_disk{table=\"3\",table_name=\"emb\"} 1"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_rows_to_disk_total{table=\"3\",table_name=\"emb\"} 2"));
  EXPECT_THAT(text,
              HasSubstr("pscluster_ps_rows_from_disk_total{table=\"3\",table_name=\"emb\"} 1"));
  EXPECT_THAT(text, HasSubstr("pscluster_ps_disk_tier_reads_total{table=\"3\","
                              "table_name=\"emb\"} 2"));
}

}  // namespace
}  // namespace pscluster::ps
