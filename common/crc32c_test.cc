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

TEST(Crc32cTest, HardwareAndPortablePathsAgreeOnOddLengthsAndOffsets) {
  std::string s(1000, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 131 + 7);
  for (size_t off : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 500, 993}) {
      EXPECT_EQ(Extend(0x12345678u, s.data() + off, n),
                ExtendPortable(0x12345678u, s.data() + off, n))
          << "offset " << off << " length " << n;
    }
  }
}

TEST(Crc32cTest, EmptyInputIsZero) { EXPECT_EQ(Value("", 0), 0u); }

}  // namespace
}  // namespace pscluster::crc32c
