// AdmissionSketch: exact counts while ids do not collide, never a count too low when they
// do, counters that stop at 255, and merging as a restore does. RowLifecycle: admission at
// the configured count, the sweep schedule, and the policy's bounds.
#include "server/ps/table/row_lifecycle.h"

#include <cstdint>
#include <map>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::ps {
namespace {

using ::testing::HasSubstr;

TEST(AdmissionSketchTest, CountsExactlyWhileIdsDoNotCollide) {
  AdmissionSketch sketch(1 << 20);
  for (uint64_t key = 0; key < 300; ++key) {
    for (uint64_t i = 0; i < key % 5; ++i) sketch.Add(key, 1);
  }
  for (uint64_t key = 0; key < 300; ++key) EXPECT_EQ(sketch.Count(key), key % 5) << key;
  EXPECT_EQ(sketch.bytes(), 4u << 20);
}

TEST(AdmissionSketchTest, NeverCountsTooLowWhenCountersCollide) {
  AdmissionSketch sketch(16);  // 1,000 ids in 16 counters per hash: collisions everywhere
  std::map<uint64_t, uint32_t> truth;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5000; ++i) {
    const uint64_t key = rng() % 1000;
    const uint32_t after = sketch.Add(key, 1);
    ++truth[key];
    EXPECT_GE(after, std::min<uint32_t>(truth[key], AdmissionSketch::kMaxCount));
  }
  for (const auto& [key, n] : truth) {
    EXPECT_GE(sketch.Count(key), std::min<uint32_t>(n, AdmissionSketch::kMaxCount));
  }
}

TEST(AdmissionSketchTest, CountersStopAt255) {
  AdmissionSketch sketch(64);
  EXPECT_EQ(sketch.Add(9, 200), 200u);
  EXPECT_EQ(sketch.Add(9, 200), 255u);
  EXPECT_EQ(sketch.Count(9), 255u);
}

TEST(AdmissionSketchTest, MergingAddsCountsAndRefusesAnotherSize) {
  AdmissionSketch a(1 << 10), b(1 << 10), other(1 << 11);
  a.Add(1, 2);
  b.Add(1, 3);
  b.Add(2, 250);
  a.Add(2, 10);
  ASSERT_TRUE(a.Merge(b.counts()).ok());
  EXPECT_EQ(a.Count(1), 5u);
  EXPECT_EQ(a.Count(2), 255u);
  const std::string before = a.counts();
  absl::Status s = a.Merge(other.counts());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("admission_counters"));
  EXPECT_EQ(a.counts(), before);
}

TEST(RowLifecycleTest, AdmitsAnIdAtItsNthPushAndCountsBoth) {
  SparseRowPolicy policy;
  policy.set_admit_after_pushes(3);
  RowLifecycle lifecycle(policy);
  EXPECT_FALSE(lifecycle.Admit(5, 1));
  EXPECT_FALSE(lifecycle.Admit(5, 1));
  EXPECT_TRUE(lifecycle.Admit(5, 1));
  EXPECT_TRUE(lifecycle.Admit(6, 3));  // three workers' pushes in one BSP step
  TableStats stats;
  lifecycle.FillStats(&stats);
  EXPECT_EQ(stats.rows_admitted(), 2u);
  EXPECT_EQ(stats.rows_not_admitted(), 2u);
}

TEST(RowLifecycleTest, WithoutAPolicyEveryIdIsAdmittedAndNothingSwept) {
  RowLifecycle lifecycle{SparseRowPolicy()};
  EXPECT_FALSE(lifecycle.counts_pushes());
  EXPECT_FALSE(lifecycle.tracks_steps());
  EXPECT_TRUE(lifecycle.Admit(5, 1));
  EXPECT_EQ(lifecycle.bytes(), 0u);
  for (int64_t step = 0; step < 100; ++step) EXPECT_FALSE(lifecycle.SweepAt(step));
}

TEST(RowLifecycleTest, SweepsEveryEighthOfTheIdlePeriodOncePerStep) {
  SparseRowPolicy policy;
  policy.set_evict_after_steps(16);
  RowLifecycle lifecycle(policy);
  EXPECT_EQ(lifecycle.SweepAt(0), std::optional<int64_t>(-16));
  EXPECT_FALSE(lifecycle.SweepAt(0));  // a step's later pushes (ASP) sweep no more
  EXPECT_FALSE(lifecycle.SweepAt(1));
  EXPECT_EQ(lifecycle.SweepAt(2), std::optional<int64_t>(-14));
  EXPECT_EQ(lifecycle.SweepAt(40), std::optional<int64_t>(24));
}

TEST(RowLifecycleTest, PoliciesOutOfBoundsAreRefusedNamingTheField) {
  auto refused = [](TableSpec spec, const char* field) {
    absl::Status s = ValidateRowPolicy(spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  TableSpec sparse;
  sparse.set_kind(TableSpec::SPARSE);
  TableSpec spec = sparse;
  spec.mutable_rows()->set_admit_after_pushes(256);
  refused(spec, "admit_after_pushes");
  spec = sparse;
  spec.mutable_rows()->set_admission_counters((1 << 22) + 1);
  refused(spec, "admission_counters");
  spec = sparse;
  spec.mutable_rows()->set_evict_after_steps(uint64_t{1} << 41);
  refused(spec, "evict_after_steps");
  TableSpec dense;
  dense.set_kind(TableSpec::DENSE);
  dense.mutable_rows()->set_evict_after_steps(10);
  refused(dense, "SPARSE tables only");
  spec = sparse;
  spec.mutable_rows()->set_admit_after_pushes(255);
  spec.mutable_rows()->set_evict_after_steps(1000);
  EXPECT_TRUE(ValidateRowPolicy(spec).ok());
}

}  // namespace
}  // namespace pscluster::ps
