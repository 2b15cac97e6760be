#include "common/crc32c.h"

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace pscluster::crc32c {
namespace {

// Known answers from RFC 3720 (iSCSI), B.4.
TEST(Crc32cTest, MatchesRfc3720Vectors) {
  char buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(Value(buf, sizeof(buf)), 0x8a9136aau);
  std::memset(buf, 0xff, sizeof(buf));
  EXPECT_EQ(Value(buf, sizeof(buf)), 0x62a8ab43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<char>(i);
  EXPECT_EQ(Value(buf, sizeof(buf)), 0x46dd794eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<char>(31 - i);
  EXPECT_EQ(Value(buf, sizeof(buf)), 0x113fdb5cu);
}

TEST(Crc32cTest, CheckValueOf123456789) { EXPECT_EQ(Value("123456789", 9), 0xe3069283u); }

TEST(Crc32cTest, ExtendingInPiecesEqualsOneShotAtEverySplit) {
  std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t split = 0; split <= s.size(); ++split) {
    EXPECT_EQ(Extend(Value(s.data(), split), s.data() + split, s.size() - split),
              Value(s.data(), s.size()))
        << "split " << split;
  }
}

TEST(Crc32cTest, EmptyInputIsZero) { EXPECT_EQ(Value("", 0), 0u); }

}  // namespace
}  // namespace pscluster::crc32c
