#include "common/address.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseHostPortTest, AcceptsNamesIpv4AndBracketedIpv6WithAPortInRange) {
  const std::string longest_name = std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                                   std::string(63, 'c') + "." + std::string(61, 'd');
  ASSERT_EQ(longest_name.size(), 253u);
  struct Case {
    std::string value, host;
    uint16_t port;
  };
  for (const Case& c : std::vector<Case>{
           {"127.0.0.1:4000", "127.0.0.1", 4000},
           {"localhost:1", "localhost", 1},
           {"[::1]:65535", "[::1]", 65535},
           {"[fe80::1%eth0]:80", "[fe80::1%eth0]", 80},
           {"coordinator:4000", "coordinator", 4000},
           {"shard-0.pscluster_net.svc.cluster.local:5000",
            "shard-0.pscluster_net.svc.cluster.local", 5000},
           {longest_name + ":4000", longest_name, 4000},
       }) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(c.value, "--coordinator");
    ASSERT_TRUE(parsed.ok()) << c.value << ": " << parsed.status();
    EXPECT_EQ(parsed->host, c.host);
    EXPECT_EQ(parsed->port, c.port);
  }
}

TEST(ParseHostPortTest, RefusesEachMalformedAddressSayingWhatIsWrongAndWhatIsValid) {
  struct Case {
    std::string value, says;
  };
  for (const Case& c : std::vector<Case>{
           {"localhost:0", "port 0, outside 1-65535"},
           {"localhost:65536", "port 65536, outside 1-65535"},
           {"localhost:99999", "port 99999, outside 1-65535"},
           {"localhost:0000080000", "outside 1-65535"},
           {"localhost", "has no port"},
           {"localhost:", "has no port after the ':'"},
           {":4000", "has no host"},
           {"", "is empty"},
           {"http://127.0.0.1:4000", "has a scheme ('http://')"},
           {"grpc://127.0.0.1:4000", "has a scheme ('grpc://')"},
           {"dns:///coordinator:4000", "has a scheme ('dns://')"},
           {"local host:4000", "has whitespace (byte 5)"},
           {"localhost:4000\n", "has whitespace (byte 14)"},
           {" localhost:4000", "has whitespace (byte 0)"},
           {std::string("local\0host:4000", 15), "has a control character (byte 5)"},
           {"h\xc3\xa9te:4000", "has a non-ASCII byte"},
           {"localhost:4o00", "port '4o00': no number"},
           {"localhost:-1", "port '-1': no number"},
           {"::1:4000", "an IPv6 address goes in brackets"},
           {"[::1:4000", "a '[' without its ']'"},
           {"[::1]4000", "no ':' after the ']'"},
           {"[::1]", "has no port"},
           {"[localhost]:4000", "in brackets: no IPv6 address"},
           {"host/path:4000", "has '/' in its host"},
           {std::string(254, 'a') + ":4000", "host of 254 characters; at most 253"},
       }) {
    const absl::Status s = CheckHostPort(c.value, "--coordinator");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.value;
    EXPECT_THAT(s.message(), HasSubstr(c.says)) << c.value;
    EXPECT_THAT(s.message(), HasSubstr("--coordinator '")) << c.value;
    EXPECT_THAT(s.message(), HasSubstr("give HOST:PORT")) << c.value;
    EXPECT_THAT(s.message(), HasSubstr("PORT 1-65535")) << c.value;
  }
}

TEST(ParseHostPortTest, AThreeMebibyteHostIsRefusedWithoutBeingEchoedBack) {
  const std::string huge = std::string(3 << 20, 'a') + ":4000";
  const absl::Status s = CheckHostPort(huge, "shard 0's address");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("shard 0's address '"));
  EXPECT_THAT(s.message(), HasSubstr("host of 3145728 characters; at most 253"));
  EXPECT_THAT(s.message(), HasSubstr("(3145733 bytes)"));
  EXPECT_LT(s.message().size(), 1000u);
}

TEST(ShownValueTest, EscapesControlCharactersAndCutsLongValues) {
  EXPECT_EQ(ShownValue("a\nb"), "a\\nb");
  EXPECT_EQ(ShownValue(std::string(64, 'x')), std::string(64, 'x'));
  EXPECT_EQ(ShownValue(std::string(65, 'x')), std::string(64, 'x') + "... (65 bytes)");
}

TEST(CheckLabelTest, AcceptsPrintableNamesUpToTheBoundEmptyIncluded) {
  EXPECT_TRUE(CheckLabel("", "worker 0's address").ok());
  EXPECT_TRUE(CheckLabel("node-7/pid:4242", "worker 0's address").ok());
  EXPECT_TRUE(CheckLabel(std::string(kMaxHostPortLength, 'w'), "worker 0's address").ok());
}

TEST(CheckLabelTest, RefusesLongOrUnprintableLabelsNamingTheField) {
  absl::Status s = CheckLabel(std::string(3 << 20, 'w'), "worker 0's address");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("worker 0's address '"));
  EXPECT_THAT(s.message(), HasSubstr("longer than 259 bytes"));
  EXPECT_LT(s.message().size(), 1000u);
  s = CheckLabel("node 7", "worker 0's address");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has whitespace (byte 4)"));
  s = CheckLabel("node\x1b[2J", "worker 0's address");
  EXPECT_THAT(s.message(), HasSubstr("has a control character (byte 4)"));
  EXPECT_THAT(s.message(), Not(HasSubstr("\x1b")));
}

}  // namespace
}  // namespace pscluster
