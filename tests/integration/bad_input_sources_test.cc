// Wrong inputs named as the user wrote them, refused before anything
// starts: a directory or a file without the execute bit as the program, a
// file that is no hostfile, a config file that is not TOML or has a typo,
// more workers than the machine's limits allow, and values that came from a
// variable (PYTHON_EXEC, PET_*) or a line of the config file.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <vector>

#include "launcher_harness.h"

namespace ddp::testing {
namespace {

using namespace launcher_test;

struct Case {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string expected;  // the whole error line after "[ddprun] error: "
};

void expect_refused(const Case& c) {
  const auto started = std::chrono::steady_clock::now();
  auto r = ddprun(c.args, c.env);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "[ddprun] error: " + c.expected + "\n");
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5)) << c.expected;
}

TEST(BadInputSources, TheProgramIsNamedAsADirectoryOrAsNotExecutable) {
  const std::string dir = make_temp_dir();
  write_file(dir + "/noexec.sh", "echo hi\n");
  chmod((dir + "/noexec.sh").c_str(), 0644);
  expect_refused({{"--nproc_per_node=2", dir},
                  {},
                  "program '" + dir +
                      "' is a directory without a __main__.py (give the script inside it, or -m "
                      "for a package)"});
  expect_refused({{"--no_python", dir}, {}, "program '" + dir + "' is a directory, not a program"});
  expect_refused({{"--no_python", dir + "/noexec.sh"},
                  {},
                  "program '" + dir +
                      "/noexec.sh' is not executable (no execute permission: chmod +x it, or run "
                      "it through its interpreter)"});
}

TEST(BadInputSources, AFileThatIsNoHostfileIsNamedWithTheFormsItShouldHave) {
  const std::string dir = make_temp_dir();
  write_file(dir + "/passwd", "root:x:0:0:root:/root:/bin/bash\n");
  expect_refused({{"--hostfile", dir + "/passwd", "true"},
                  {},
                  dir + "/passwd:1: 'root:x:0:0:root:/root:/bin/bash' is not a host entry (host "
                        "'root:x:0:0:root:/root:/bin/bash' is not an IPv6 address); expected 'HOST "
                        "[slots=N]' or 'HOST:N' ('[IPV6]:N' for an IPv6 address with slots)"});
}

TEST(BadInputSources, AConfigFileThatIsNotTomlOrHasATypoIsRefusedWithItsLine) {
  const std::string dir = make_temp_dir();
  write_file(dir + "/hostname.toml", "vm\n");
  write_file(dir + "/typo.toml", "# the job\nnproc_per_nod = 2\n");
  write_file(dir + "/far.toml", "zzzzzz = 2\n");
  expect_refused(
      {{"--config", dir + "/hostname.toml", "--no_python", "true"},
       {},
       dir + "/hostname.toml:1: 'vm' is not TOML's KEY = VALUE (e.g. nproc_per_node = 2)"});
  expect_refused({{"--config", dir + "/typo.toml", "--no_python", "true"},
                  {},
                  dir + "/typo.toml:2: unknown key 'nproc_per_nod' (did you mean "
                        "'nproc_per_node'?)"});
  expect_refused({{"--config", dir + "/far.toml", "--no_python", "true"},
                  {},
                  dir + "/far.toml:1: unknown key 'zzzzzz' (the keys are ddprun's long flags)"});
}

TEST(BadInputSources, MoreWorkersThanTheLimitsAllowAreRefusedAtOnce) {
  // Under a limit of 1024 open files, 100000 workers (200032 descriptors)
  // are refused before one starts, not after thousands did.
  const auto started = std::chrono::steady_clock::now();
  auto r = run_process(
      {"/bin/sh", "-c", "ulimit -n 1024 && exec \"$0\" --nproc_per_node=100000 --no_python true",
       kDdprun},
      {}, std::chrono::seconds(30));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err,
            "[ddprun] error: --nproc_per_node=100000: too many workers for this machine's "
            "limits: 200032 open files are needed, the limit is 1024 (hard limit 1024; raise it "
            "with `ulimit -n 200032` or in /etc/security/limits.conf)\n");
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
}

TEST(BadInputSources, AValueFromAVariableOrAConfigLineIsNamedByItsSource) {
  const std::string dir = make_temp_dir();
  write_file(dir + "/job.toml", "# the job\n\nnproc_per_node = \"abc\"\n");
  write_file(dir + "/restarts.toml", "nproc_per_node = 1\nmax_restarts = \"x\"\n");
  write_file(dir + "/train.py", "print('hi')\n");
  expect_refused({{dir + "/train.py"},
                  {{"PYTHON_EXEC", "/nonexistent"}},
                  "PYTHON_EXEC=/nonexistent: python interpreter not found (for program '" + dir +
                      "/train.py'); set PYTHON_EXEC to an interpreter, or pass --no_python"});
  expect_refused({{"--no_python", "true"},
                  {{"PET_NPROC_PER_NODE", "abc"}},
                  "PET_NPROC_PER_NODE=abc: expected a positive integer, auto, cpu, gpu or xpu"});
  expect_refused({{"--no_python", "true"},
                  {{"PET_MAX_RESTARTS", "abc"}},
                  "PET_MAX_RESTARTS=abc: expected a "
                  "whole number"});
  expect_refused({{"--config", dir + "/job.toml", "--no_python", "true"},
                  {},
                  dir + "/job.toml:3: nproc_per_node = \"abc\": expected a positive integer, "
                        "auto, cpu, gpu or xpu"});
  expect_refused({{"--config", dir + "/restarts.toml", "--no_python", "true"},
                  {},
                  dir + "/restarts.toml:2: max_restarts = \"x\": expected a whole number"});
  // The command line wins over both: its own spelling is named.
  expect_refused({{"--nproc_per_node=abc", "--no_python", "true"},
                  {{"PET_NPROC_PER_NODE", "2"}},
                  "--nproc_per_node=abc: expected a positive integer, auto, cpu, gpu or xpu"});
}

}  // namespace
}  // namespace ddp::testing
