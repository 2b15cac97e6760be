#include "common/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(AtomicFileTest, ReplacesTheContentsAndLeavesNoTemporaryFile) {
  const std::string dir = ::testing::TempDir() + "/atomic_file";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/state.pb";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, std::string("sec\0nd", 6)).ok());
  EXPECT_EQ(Read(path), std::string("sec\0nd", 6));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(AtomicFileTest, AMissingDirectoryIsUnavailableNamingThePath) {
  absl::Status s = WriteFileAtomically(::testing::TempDir() + "/no/such/dir/f", "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("no/such/dir/f.tmp"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace pscluster
