#include "worker/modes/steps_file.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pscluster::modes {
namespace {

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  return lines;
}

StepDone Step(int64_t step, float loss, bool epoch_end = false) {
  StepDone d;
  d.step = step;
  d.epoch = 1;
  d.loss = loss;
  d.took = absl::Milliseconds(3);
  d.comm = absl::Milliseconds(1);
  d.epoch_end = epoch_end;
  return d;
}

TEST(StepsFileTest, OneLinePerStepAndRollbackAppendedAcrossRestarts) {
  const std::string path = ::testing::TempDir() + "/steps.jsonl";
  std::remove(path.c_str());
  Mode mode = coord::PS;
  {
    auto f = StepsFile::Open(path, [&] { return mode; });
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->AfterStep(Step(0, 2.5f)).ok());
    mode = coord::ALLREDUCE;
    ASSERT_TRUE((*f)->AfterStep(Step(1, 1.5f, /*epoch_end=*/true)).ok());
    (*f)->RolledBack(2, 1);
  }
  {  // a replacement worker of the same rank appends
    auto f = StepsFile::Open(path, [&] { return mode; });
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->AfterStep(Step(1, 1.25f)).ok());
  }
  const std::vector<nlohmann::json> lines = Lines(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["step"], 0);
  EXPECT_EQ(lines[0]["loss"], 2.5);
  EXPECT_EQ(lines[0]["mode"], "ps");
  EXPECT_DOUBLE_EQ(lines[0]["seconds"].get<double>(), 0.003);
  EXPECT_DOUBLE_EQ(lines[0]["comm_seconds"].get<double>(), 0.001);
  EXPECT_EQ(lines[1]["mode"], "allreduce");
  EXPECT_EQ(lines[2]["rollback"]["failed"], 2);
  EXPECT_EQ(lines[2]["rollback"]["resumed"], 1);
  EXPECT_EQ(lines[3]["loss"], 1.25);
}

TEST(StepsFileTest, AFileThatCannotBeOpenedIsRefusedByName) {
  auto f = StepsFile::Open("/nonexistent-dir/steps.jsonl", [] { return coord::PS; });
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(f.status().message().find("/nonexistent-dir/steps.jsonl"), absl::string_view::npos);
}

// /dev/full refuses every write with ENOSPC, as a full disk does.
TEST(StepsFileTest, AFailedWriteIsSaidAndTheRunGoesOn) {
  auto f = StepsFile::Open("/dev/full", [] { return coord::PS; });
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->AfterStep(Step(0, 1.0f, /*epoch_end=*/true)).ok());
  EXPECT_TRUE((*f)->AfterStep(Step(1, 1.0f, /*epoch_end=*/true)).ok());
}

}  // namespace
}  // namespace pscluster::modes
