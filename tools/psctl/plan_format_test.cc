#include "tools/psctl/plan_format.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tools/psctl/plan_testing.h"

namespace pscluster::plan {
namespace {

using testing::Exercise13B;
using testing::MustPlan;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// Braces and brackets balance outside strings, strings close, and nothing follows the
// object but its newline.
::testing::AssertionResult WellFormed(absl::string_view json) {
  std::vector<char> open;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      if (c == '"') in_string = false;
      if (static_cast<unsigned char>(c) < 0x20) return ::testing::AssertionFailure() << "control";
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') open.push_back(c);
    if (c == '}' || c == ']') {
      if (open.empty() || open.back() != (c == '}' ? '{' : '[')) {
        return ::testing::AssertionFailure() << "unbalanced " << c << " at " << i;
      }
      open.pop_back();
      if (open.empty() && json.substr(i + 1) != "\n") {
        return ::testing::AssertionFailure() << "after the object: " << json.substr(i + 1);
      }
    }
  }
  if (in_string || !open.empty()) return ::testing::AssertionFailure() << "unclosed";
  return ::testing::AssertionSuccess();
}

TEST(PlanFormatTest, JsonIsOneBalancedObjectWithEverySection) {
  const Plan plan = MustPlan(Exercise13B());
  const std::string json = PlanJson(plan);
  EXPECT_TRUE(WellFormed(json)) << json;
  EXPECT_EQ(json.front(), '{');
  for (const char* key : {"model", "device", "cluster", "data", "layouts", "recommended", "why",
                          "compute", "checkpoint", "communication", "collectives"}) {
    EXPECT_TRUE(Contains(json, absl::StrCat("\"", key, "\":"))) << key;
  }
  EXPECT_TRUE(Contains(
      json, absl::StrCat("\"recommended\":\"", plan.layouts[plan.recommended].name, "\"")));
  EXPECT_FALSE(Contains(json, "nan"));
  EXPECT_FALSE(Contains(json, "inf"));
}

TEST(PlanFormatTest, JsonNumbersReadBackExactly) {
  const std::string json = PlanJson(MustPlan(Exercise13B()));
  EXPECT_TRUE(Contains(json, "\"params\":13000000000,")) << json;
  EXPECT_TRUE(Contains(json, "\"flops\":3.9e+21,")) << json;
  EXPECT_TRUE(Contains(json, "\"memory_headroom\":0.1,")) << json;
}

TEST(PlanFormatTest, JsonEscapesADeviceNameAndGivesNoCommunicationForALayoutThatDoesNotFit) {
  PlanInput in = Exercise13B();
  in.gpu = "my \"gpu\"\\2";
  in.gpu_memory_bytes = 80e9;
  in.gpu_flops = 300e12;
  in.intra_node_gbps = 300;
  in.host_copy_gbps = 25;
  in.memory_gbps = 2000;
  const std::string json = PlanJson(MustPlan(in));
  EXPECT_TRUE(WellFormed(json)) << json;
  EXPECT_TRUE(Contains(json, R"("name":"my \"gpu\"\\2")")) << json;
  EXPECT_TRUE(Contains(json, R"("name":"DDP",)"));
  EXPECT_TRUE(Contains(json,
                       R"("fits":"no","recompute":false,"gemm_seconds":null,"memory_seconds":null,)"
                       R"("compute_seconds":null,)"
                       R"("step_seconds":null,"communication":null})"));
}

TEST(PlanFormatTest, NothingFitsSaysSoInBothForms) {
  PlanInput in = Exercise13B();
  in.params = 2e12;
  in.nodes = 1;
  const Plan plan = MustPlan(in);
  ASSERT_EQ(plan.recommended, -1);
  EXPECT_TRUE(Contains(PlanJson(plan), "\"recommended\":null,"));
  EXPECT_TRUE(WellFormed(PlanJson(plan)));
  const std::string table = PlanTable(plan);
  EXPECT_TRUE(Contains(table, "3. Recommended layout: none")) << table;
  EXPECT_TRUE(Contains(table, "Nothing fits")) << table;
}

TEST(PlanFormatTest, TableHasEverySectionAndMarksFits) {
  const Plan plan = MustPlan(Exercise13B());
  const std::string table = PlanTable(plan);
  for (const char* heading : {"1. Data", "2. Memory per GPU", "3. Recommended layout: ",
                              "4. Communication per step", "5. Compute", "6. Checkpoints"}) {
    EXPECT_TRUE(Contains(table, heading)) << heading;
  }
  bool ddp = false, zero3 = false;
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    const bool row = Contains(line, " 1x1x32 ");
    if (row && absl::StartsWith(line, "  DDP "))
      ddp = Contains(line, " 208.0 ") && Contains(line, " no");
    if (row && absl::StartsWith(line, "  ZeRO-3/FSDP ")) {
      zero3 = Contains(line, " 6.5 ") && Contains(line, " yes ");
    }
    EXPECT_EQ(line.find_last_not_of(' ') + 1, line.size()) << "trailing blanks: " << line;
  }
  EXPECT_TRUE(ddp) << table;
  EXPECT_TRUE(zero3) << table;
}

// A model far past any GPU (a quadrillion parameters on 8000): the memory columns change
// unit (TB) rather than overflow their width, so every layout row lines up.
TEST(PlanFormatTest, MemoryColumnsKeepTheirWidthForAHugeModel) {
  PlanInput in = Exercise13B();
  in.params = 1e15;
  in.dataset_bytes = 4e15;
  in.nodes = 1000;
  const std::string table = PlanTable(MustPlan(in));
  EXPECT_TRUE(Contains(table, "2. Memory per GPU, TB: 0.0773 usable of 0.0859")) << table;
  size_t fits_at = std::string::npos;
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    if (absl::StartsWith(line, "  layout ")) fits_at = line.find("fits");
    if (fits_at == std::string::npos || !Contains(line, "x") || !absl::EndsWith(line, " no")) {
      continue;
    }
    EXPECT_EQ(line.size(), fits_at + 2) << "a row out of line:\n" << line;
  }
  EXPECT_NE(fits_at, std::string::npos) << table;
}

}  // namespace
}  // namespace pscluster::plan
