#include "common/command_line.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, answer_to_everything, 42, "A flag of this test's own, which --help must list.");

namespace pscluster {
namespace {

TEST(CommandLineTest, HelpListsTheProgramsFlagsWithDefaultsButNotAbseils) {
  const std::string help = FlagsHelp("usage line", /*full=*/false);
  EXPECT_EQ(help.rfind("usage line", 0), 0u) << help;
  EXPECT_NE(help.find("--answer_to_everything=42\n"), std::string::npos) << help;
  EXPECT_NE(help.find("which --help must list."), std::string::npos) << help;
  EXPECT_NE(help.find("from common/command_line_test.cc:"), std::string::npos) << help;
  EXPECT_EQ(help.find("--flagfile="), std::string::npos) << help;
  EXPECT_NE(FlagsHelp("u", /*full=*/true).find("--flagfile="), std::string::npos);
}

TEST(CommandLineTest, HelpAndVersionExitZero) {
  char name[] = "prog", help[] = "--help", version[] = "-version";
  char* with_help[] = {name, help};
  EXPECT_EXIT(HandleHelpAndVersion(2, with_help, "u"), ::testing::ExitedWithCode(0), "");
  char* with_version[] = {name, version};
  EXPECT_EXIT(HandleHelpAndVersion(2, with_version, "u"), ::testing::ExitedWithCode(0), "");
}

TEST(CommandLineTest, OtherArgumentsAndHelpAfterDoubleDashReturn) {
  char name[] = "prog", flag[] = "--answer_to_everything=1", dashes[] = "--", help[] = "--help";
  char* argv[] = {name, flag, dashes, help};
  HandleHelpAndVersion(4, argv, "u");  // returns: --help is an argument after "--"
  SUCCEED();
}

}  // namespace
}  // namespace pscluster
