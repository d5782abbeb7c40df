// Every flag of the installed torchrun 2.x (read from its own --help) is
// accepted by ddprun's parser, in each of its spellings, with a value of the
// kind torchrun takes: a copied torchrun command line is never refused.

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include "cli/launch_spec.h"
#include "ddp/common/error.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

struct TorchrunFlag {
  std::vector<std::string> spellings;  // "--nproc-per-node", "--nproc_per_node"
  std::string metavar;                 // "" for a switch; "{a,b}" for choices
};

// The "options:" section of argparse's help: one entry per line that starts
// with an option, e.g. "  --max-restarts MAX_RESTARTS, --max_restarts MAX_RESTARTS".
std::vector<TorchrunFlag> flags_in_help(const std::string& help) {
  std::vector<TorchrunFlag> flags;
  std::istringstream lines(help.substr(help.find("options:")));
  const std::regex option_re(R"((-{1,2}[A-Za-z][\w-]*)(?: (\{[^}]*\}|[A-Z_]+))?)");
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  -", 0) != 0) continue;
    const std::string names = line.substr(2, line.find("  ", 2) - 2);
    TorchrunFlag flag;
    for (std::sregex_iterator it(names.begin(), names.end(), option_re), end; it != end; ++it) {
      flag.spellings.push_back((*it)[1]);
      flag.metavar = (*it)[2];
    }
    flags.push_back(flag);
  }
  return flags;
}

// A value of the kind torchrun takes for `metavar`.
std::string value_for(const std::string& metavar, const std::string& log_dir) {
  static const std::map<std::string, std::string> values = {
      {"NNODES", "1"},
      {"NPROC_PER_NODE", "2"},
      {"RDZV_BACKEND", "c10d"},
      {"RDZV_ENDPOINT", "127.0.0.1:29400"},
      {"RDZV_ID", "job7"},
      {"RDZV_CONF", "timeout=900,use_libuv=1"},
      {"MAX_RESTARTS", "1"},
      {"MONITOR_INTERVAL", "0.5"},
      {"EVENT_LOG_HANDLER", "null"},
      {"ROLE", "trainer"},
      {"REDIRECTS", "3"},
      {"TEE", "0:1"},
      {"LOG_LINE_PREFIX_TEMPLATE", "${rank}: "},
      {"LOCAL_RANKS_FILTER", "0,1,2,3"},
      {"DUPLICATE_STDOUT_FILTERS", "loss"},
      {"DUPLICATE_STDERR_FILTERS", "warn"},
      {"NODE_RANK", "0"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "29500"},
      {"LOCAL_ADDR", "127.0.0.1"},
      {"LOGS_SPECS", "default"},
      {"SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGUSR1"},
      {"SHUTDOWN_TIMEOUT", "45"}};
  if (metavar == "LOG_DIR") return log_dir;
  if (!metavar.empty() && metavar.front() == '{')
    return metavar.substr(1, metavar.find_first_of(",}") - 1);
  auto it = values.find(metavar);
  return it == values.end() ? "1" : it->second;
}

TEST(TorchrunFlags, EveryFlagOfTheInstalledTorchrunIsAccepted) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const std::string python = torch2_python();
  const std::string torchrun = python.substr(0, python.rfind('/') + 1) + "torchrun";
  auto help = run_process({torchrun, "--help"}, {}, 60s);
  ASSERT_TRUE(help.exited && help.code == 0) << help.out << help.err;
  const std::vector<TorchrunFlag> flags = flags_in_help(help.out);
  ASSERT_GE(flags.size(), 25u) << "could not read torchrun's options from:\n" << help.out;
  const std::string log_dir = make_temp_dir();
  int spellings = 0;
  for (const auto& flag : flags) {
    for (const auto& spelling : flag.spellings) {
      std::vector<std::string> argv = {"ddprun", spelling};
      if (!flag.metavar.empty()) argv.push_back(value_for(flag.metavar, log_dir));
      argv.push_back("train.py");
      try {
        launcher::parse_launch_args(argv, /*check_program=*/false);
        ++spellings;
      } catch (const Error& e) {
        ADD_FAILURE() << "ddprun refuses torchrun's " << spelling << " "
                      << (argv.size() > 3 ? argv[2] : "") << ": " << e.what();
      }
    }
  }
  std::printf("torchrun --help: %zu options, %d spellings, all accepted\n", flags.size(),
              spellings);
}

TEST(TorchrunFlags, TheHelpReaderFindsEachSpellingAndItsValue) {
  const auto flags = flags_in_help(
      "usage: x\n\noptions:\n  -h, --help            show\n"
      "  --max-restarts MAX_RESTARTS, --max_restarts MAX_RESTARTS\n                        Max.\n"
      "  --start-method {spawn,fork,forkserver}, --start_method {spawn,fork,forkserver}\n"
      "  --standalone          Start\n");
  ASSERT_EQ(flags.size(), 4u);
  EXPECT_EQ(flags[0].spellings, (std::vector<std::string>{"-h", "--help"}));
  EXPECT_EQ(flags[1].spellings, (std::vector<std::string>{"--max-restarts", "--max_restarts"}));
  EXPECT_EQ(flags[1].metavar, "MAX_RESTARTS");
  EXPECT_EQ(value_for(flags[2].metavar, ""), "spawn");
  EXPECT_TRUE(flags[3].metavar.empty());
}

}  // namespace
}  // namespace ddp::testing
