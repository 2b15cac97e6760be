#include "common/recent_ids.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(RecentIdsTest, ARepeatChangesNothingAndTheOldestGoFirst) {
  RecentIds<int> ids(2);
  EXPECT_TRUE(ids.Add("a", 1));
  EXPECT_FALSE(ids.Add("a", 7));  // a repeat keeps the first value
  ASSERT_NE(ids.Find("a"), nullptr);
  EXPECT_EQ(*ids.Find("a"), 1);
  EXPECT_TRUE(ids.Add("b", 2));
  EXPECT_TRUE(ids.Add("c", 3));  // past the capacity: "a" is forgotten
  EXPECT_EQ(ids.Find("a"), nullptr);
  std::vector<std::pair<std::string, int>> seen;
  ids.ForEach([&](const std::string& id, int v) { seen.emplace_back(id, v); });
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, int>>{{"b", 2}, {"c", 3}}));
  EXPECT_TRUE(ids.Add("a", 4));  // forgotten, so new again
  ids.Clear();
  EXPECT_EQ(ids.size(), 0u);
  EXPECT_EQ(ids.Find("c"), nullptr);
}

TEST(RecentIdsTest, SetReplacesAndEraseForgets) {
  RecentIds<int> ids(3);
  ids.Set("a", 1);
  ids.Set("b", 2);
  ids.Set("a", 5);  // replaced, keeping its place in the order
  EXPECT_EQ(*ids.Find("a"), 5);
  ids.Erase("a");
  ids.Erase("never added");
  EXPECT_EQ(ids.Find("a"), nullptr);
  EXPECT_EQ(ids.size(), 1u);
  std::vector<std::pair<std::string, int>> seen;
  ids.ForEach([&](const std::string& id, int v) { seen.emplace_back(id, v); });
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, int>>{{"b", 2}}));
}

}  // namespace
}  // namespace pscluster
