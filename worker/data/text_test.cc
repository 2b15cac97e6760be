#include "worker/data/text.h"

#include <fstream>
#include <string>

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "worker/data/batches.h"

namespace pscluster::data {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(LoadFortunesTest, SplitsWholeFortunesAndSkipsIndexes) {
  testing::TempDir dir("fortunes");
  // Files sorted by name: "a" then "b"; the .dat index and names with a '.' are not text.
  Write(dir.path() + "/b", "four\n%\nfive\nlines\n%\nsix\n");
  Write(dir.path() + "/a", "one\n%\ntwo\n%\nthree\n%\n");
  Write(dir.path() + "/a.dat", "binary index");
  auto corpus = LoadFortunes(dir.path(), /*held_out_every=*/3);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  // Fortunes in order: one two three four "five lines" six; every third is held out.
  EXPECT_EQ(corpus->train, "one\n%\ntwo\n%\nfour\n%\nfive\nlines\n%\n");
  EXPECT_EQ(corpus->held_out, "three\n%\nsix\n%\n");
}

TEST(LoadFortunesTest, MissingCorpusSaysWhatToInstall) {
  auto corpus = LoadFortunes("/nonexistent/fortunes");
  ASSERT_EQ(corpus.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(corpus.status().message().find("apt-get install fortunes"), std::string::npos);
  testing::TempDir empty("empty");
  EXPECT_EQ(LoadFortunes(empty.path()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadFortunes(empty.path(), 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LanguageModelDataTest, WindowsAndNextBytes) {
  auto d = MakeLanguageModelData("abcdefgh", 3);  // windows abc, def; "gh" is too short
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 2);
  EXPECT_EQ(d->dim, 3);
  EXPECT_EQ(d->label_width, 3);
  EXPECT_EQ(d->classes, 256);
  EXPECT_EQ(d->x, (std::vector<float>{'a', 'b', 'c', 'd', 'e', 'f'}));
  EXPECT_EQ(d->y, (std::vector<int32_t>{'b', 'c', 'd', 'e', 'f', 'g'}));
  EXPECT_EQ(MakeLanguageModelData("abc", 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLanguageModelData("abcd", 0).status().code(), absl::StatusCode::kInvalidArgument);
  // Bytes above 127 are tokens 128..255, not negative.
  auto high = MakeLanguageModelData("\xff\x80", 1);
  ASSERT_TRUE(high.ok());
  EXPECT_EQ(high->x[0], 255.0f);
  EXPECT_EQ(high->y[0], 128);
}

TEST(LanguageModelDataTest, BatchesCarryEveryLabelOfAnExample) {
  // Consecutive letters: every label is its input byte + 1.
  auto d = MakeLanguageModelData("abcdefghijklmnopqrstu", 4);  // 5 windows
  ASSERT_TRUE(d.ok());
  auto it = BatchIterator::Create(&*d, 0, 1, 2, 1);
  ASSERT_TRUE(it.ok()) << it.status();
  Batch b;
  it->Next(&b);
  ASSERT_EQ(b.x.size(), 8u);
  ASSERT_EQ(b.y.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b.y[i], static_cast<int32_t>(b.x[i]) + 1) << i;
}

}  // namespace
}  // namespace pscluster::data
