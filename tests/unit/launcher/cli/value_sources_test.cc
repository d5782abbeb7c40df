// Where an option's value came from, and the strict reading of --config
// files (launcher/cli/value_sources.h), and the resource budget's rule
// (launcher/cli/resource_budget.h). Pure: no processes, an injected getenv.

#include "cli/value_sources.h"

#include <gtest/gtest.h>

#include "cli/resource_budget.h"
#include "error_of.h"

namespace ddp::launcher {
namespace {

using ::ddp::testing::error_of;

std::vector<KnownOption> options() {
  KnownOption nproc{{"--nproc_per_node", "--nproc-per-node"}, true, false, ""};
  KnownOption restarts{{"--max_restarts", "--max-restarts"}, true, true, "-r"};
  KnownOption config{{"--config"}, true, false, ""};
  KnownOption flag{{"--standalone"}, false, false, ""};
  return {nproc, restarts, config, flag};
}

TEST(ValueSources, NearestNameIsCloseOrNothing) {
  const std::vector<std::string> names = {"nproc_per_node", "nnodes", "max_restarts"};
  EXPECT_EQ(nearest_name("nproc_per_nod", names), "nproc_per_node");
  EXPECT_EQ(nearest_name("nnode", names), "nnodes");
  EXPECT_EQ(nearest_name("max_restart", names), "max_restarts");
  EXPECT_EQ(nearest_name("zzzzzz", names), "");
}

TEST(ValueSources, ConfigLinesAreKeyValueWithKnownKeysAndArraysMaySpanLines) {
  const auto entries = read_config_entries(
      "# job\n\nnproc_per_node = 2  # two\nmax-restarts = [\n  1,\n  2]\nstandalone = true\n",
      "job.toml", options());
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].key, "nproc_per_node");
  EXPECT_EQ(entries[0].value, "2");
  EXPECT_EQ(entries[0].line, 3);
  EXPECT_EQ(entries[1].value, "[ 1, 2]");
  EXPECT_EQ(entries[2].line, 7);
  auto bad = [](const std::string& text) {
    return error_of([&] { read_config_entries(text, "j.toml", options()); });
  };
  EXPECT_EQ(bad("vm\n"), "j.toml:1: 'vm' is not TOML's KEY = VALUE (e.g. nproc_per_node = 2)");
  EXPECT_EQ(bad("\nnproc_per_node =\n"),
            "j.toml:2: 'nproc_per_node =' is not TOML's KEY = VALUE (e.g. nproc_per_node = 2)");
  EXPECT_EQ(bad("[ddprun]\n"),
            "j.toml:1: '[ddprun]': sections are not read (write KEY = VALUE lines only)");
  EXPECT_EQ(bad("max_restart = 1\n"),
            "j.toml:1: unknown key 'max_restart' (did you mean 'max_restarts'?)");
  EXPECT_EQ(bad("name = \"a # b\"\n"),
            "j.toml:1: unknown key 'name' (the keys are ddprun's long flags)");
}

TEST(ValueSources, AnErrorNamesTheVariableOrTheConfigLineUnlessTheCommandLineGaveIt) {
  const std::map<std::string, std::string> envnames = {{"--nproc_per_node", "PET_NPROC_PER_NODE"},
                                                       {"--max_restarts", "PET_MAX_RESTARTS"}};
  auto getenv = [](const char* name) -> const char* {
    if (std::string(name) == "PET_NPROC_PER_NODE") return "abc";
    if (std::string(name) == "PET_MAX_RESTARTS") return "x";
    return nullptr;
  };
  const std::vector<ConfigEntry> config = {{"max-restarts", "\"y\"", 4}};
  const std::string why = ": expected a positive integer";
  const ValueSources from_env(options_given({"true"}, options()), options(), envnames, {}, "",
                              getenv);
  EXPECT_EQ(from_env.relabel("--nproc_per_node=abc" + why), "PET_NPROC_PER_NODE=abc" + why);
  EXPECT_EQ(from_env.relabel("--nproc-per-node=abc" + why), "PET_NPROC_PER_NODE=abc" + why);
  EXPECT_EQ(from_env.relabel("no option first"), "no option first");
  // The file wins over the variable; the command line (either form) over both.
  const ValueSources from_file(options_given({"--config", "j.toml", "true"}, options()), options(),
                               envnames, config, "j.toml", getenv);
  EXPECT_EQ(from_file.relabel("--max_restarts=y: expected a whole number"),
            "j.toml:4: max-restarts = \"y\": expected a whole number");
  const ValueSources given(
      options_given({"-r", "7", "--nproc-per-node=9", "train", "--max_restarts=1"}, options()),
      options(), envnames, config, "j.toml", getenv);
  EXPECT_EQ(given.relabel("--nproc_per_node=9" + why), "--nproc_per_node=9" + why);
  EXPECT_EQ(given.relabel("--max_restarts=7 is too many"), "--max_restarts=7 is too many");
  EXPECT_EQ(
      options_given({"--standalone", "--config", "j.toml", "train", "--config", "x"}, options())
          .at("config"),
      "j.toml");
  EXPECT_EQ(options_given({"train", "--config", "x"}, options()).count("config"), 0u);
}

TEST(ResourceBudget, WorkersBeyondTheOpenFileOrProcessLimitAreRefusedSayingHowMany) {
  const rlimit files{1024, 4096}, procs{100, 100}, unlimited{RLIM_INFINITY, RLIM_INFINITY};
  EXPECT_EQ(resource_needs(4, false).descriptors, 32 + 8);
  EXPECT_EQ(resource_needs(4, true).descriptors, 32 + 16);
  EXPECT_EQ(budget_problem(resource_needs(64, false), files, procs, false), "");
  EXPECT_EQ(budget_problem(resource_needs(1000, false), files, unlimited, false),
            "2032 open files are needed, the limit is 1024 (hard limit 4096; raise it with "
            "`ulimit -n 2032` or in /etc/security/limits.conf)");
  EXPECT_EQ(budget_problem(resource_needs(200, false), files, procs, false),
            "200 processes are needed, the limit is 100 for this user (raise it with `ulimit -u "
            "200`)");
  EXPECT_EQ(budget_problem(resource_needs(200, false), files, procs, true), "");
}

}  // namespace
}  // namespace ddp::launcher
