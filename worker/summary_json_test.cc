#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/setup.h"

namespace pscluster::worker {
namespace {

// The summary was concatenated by hand: a NaN loss came out as `nan` and a quote in a name
// as a bare quote, both unreadable by any JSON parser.
TEST(SummaryJsonTest, ANanLossAndAQuotedNameStillMakeJson) {
  modes::TrainSummary summary;
  summary.final_loss = std::nan("");
  summary.test_accuracy = 0.8955;
  summary.model = "mlp \"small\"";
  summary.final_mode = "ps";
  summary.rollbacks = {{750, 468}};
  summary.switches = {{940, "ps", "allreduce", 0.25}};
  summary.figures = {{"bubble", 1.5}};
  const std::string path = ::testing::TempDir() + "/summary.json";
  ASSERT_TRUE(WriteSummaryJson(path, 1, "ps", summary).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json = nlohmann::json::parse(text.str(), nullptr, /*exceptions=*/false);
  ASSERT_FALSE(json.is_discarded()) << text.str();
  EXPECT_TRUE(json["final_loss"].is_null()) << text.str();
  EXPECT_EQ(json["model"], "mlp \"small\"");
  EXPECT_DOUBLE_EQ(json["test_accuracy"].get<double>(), 0.8955);
  EXPECT_EQ(json["rank"], 1);
  EXPECT_EQ(json["rollbacks"][0][0], 750);
  EXPECT_EQ(json["rollbacks"][0][1], 468);
  EXPECT_EQ(json["switches"][0]["to"], "allreduce");
  EXPECT_DOUBLE_EQ(json["figures"]["bubble"].get<double>(), 1.5);
}

}  // namespace
}  // namespace pscluster::worker
