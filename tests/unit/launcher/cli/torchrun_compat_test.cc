// torchrun 2.x habits the launcher's parsing must accept: argparse's
// abbreviations, the newer flags, --rdzv_conf keys it keeps and ignores,
// TORCH_ELASTIC_SHUTDOWN_TIMEOUT, PYTHON_EXEC and Python programs without
// a .py name, and accelerators counted from fake device trees.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cli/accelerators.h"
#include "cli/launch_spec.h"
#include "cli/option_prefixes.h"
#include "ddp/common/error.h"
#include "parse_launch.h"
#include "scoped_env.h"

namespace ddp::launcher {
namespace {

bool has_notice(const LaunchSpec& spec, const std::string& text) {
  for (const auto& line : spec.notices) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

using ::ddp::testing::ScopedEnv;

TEST(OptionPrefixes, AUniquePrefixNamesItsOptionAndAnAmbiguousOneIsRefused) {
  const std::vector<KnownOption> options = {{{"--nnodes"}, true, false, ""},
                                            {{"--max_restarts", "--max-restarts"}, true, false, ""},
                                            {{"--master_addr", "--master-addr"}, true, false, ""},
                                            {{"--standalone"}, false, false, ""},
                                            {{"--redirects"}, true, true, "-r"}};
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_option_prefixes({"--nnode=2", "--max_restart", "1", "prog", "--nn"}, options),
            (V{"--nnodes=2", "--max_restarts", "1", "prog", "--nn"}));
  EXPECT_EQ(expand_option_prefixes({"--max-r=3", "--stand", "p"}, options),
            (V{"--max-restarts=3", "--standalone", "p"}));
  // A short option's value is skipped, never read as the program.
  EXPECT_EQ(expand_option_prefixes({"-r", "3", "--nnod", "1", "p"}, options),
            (V{"-r", "3", "--nnodes", "1", "p"}));
  EXPECT_EQ(expand_option_prefixes({"--", "--nnod"}, options), (V{"--", "--nnod"}));
  EXPECT_EQ(expand_option_prefixes({"--bogus", "p"}, options), (V{"--bogus", "p"}));
  try {
    expand_option_prefixes({"--ma=1", "p"}, options);
    FAIL() << "--ma is ambiguous";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "ambiguous option: --ma could match --max_restarts, --master_addr");
  }
}

TEST(TorchrunCompat, CopiedCommandLinesWithAbbreviationsParse) {
  auto spec = parse({"--nnode=1", "--max_restart=2", "--nproc-per=3", "--monitor=0.5", "prog"});
  EXPECT_EQ(spec.nnodes, 1);
  EXPECT_EQ(spec.max_restarts, 2);
  EXPECT_EQ(spec.nproc_per_node, 3);
  EXPECT_DOUBLE_EQ(spec.monitor_interval_s, 0.5);
  EXPECT_NE(error_of({"--m=1", "prog"}).find("ambiguous option: --m could match"),
            std::string::npos);
  // After the program nothing is expanded.
  EXPECT_EQ(parse({"prog", "--nnode=3"}).program_args, std::vector<std::string>{"--nnode=3"});
}

TEST(TorchrunCompat, NewerFlagsAreAcceptedWithANoticeWhereTheyChangeNothing) {
  auto spec = parse({"--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                     "--event-log-handler=console", "--duplicate-stdout-filters=loss",
                     "--duplicate_stderr_filters=warn", "prog"});
  EXPECT_TRUE(
      has_notice(spec, "--signals_to_handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 has no effect"));
  EXPECT_TRUE(has_notice(spec, "--event_log_handler=console has no effect"));
  EXPECT_TRUE(has_notice(spec, "--duplicate_stdout_filters=loss has no effect"));
  EXPECT_TRUE(has_notice(spec, "--duplicate_stderr_filters=warn has no effect"));
  // torchrun's defaults say nothing.
  EXPECT_TRUE(parse({"--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                     "--event-log-handler=null", "prog"})
                  .notices.empty());
  EXPECT_TRUE(parse({"--virtual-local-rank", "prog"}).virtual_local_rank);
  EXPECT_FALSE(parse({"prog"}).virtual_local_rank);
}

TEST(TorchrunCompat, PetVariablesOfTheNewerFlagsAreRead) {
  ScopedEnv a("PET_VIRTUAL_LOCAL_RANK", "1");
  ScopedEnv b("PET_EVENT_LOG_HANDLER", "console");
  ScopedEnv c("PET_SHUTDOWN_TIMEOUT", "7");
  auto spec = parse({"prog"});
  EXPECT_TRUE(spec.virtual_local_rank);
  EXPECT_TRUE(has_notice(spec, "--event_log_handler=console"));
  EXPECT_DOUBLE_EQ(spec.shutdown_timeout_s, 7);
}

TEST(TorchrunCompat, TheLinePrefixTemplateVariableGetsTheFlagsNotice) {
  ScopedEnv variable("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${local_rank}]:");
  auto spec = parse({"prog"});
  ASSERT_EQ(spec.notices.size(), 1u);
  EXPECT_EQ(spec.notices[0],
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE has no effect: lines are prefixed with "
            "[rank N] (--no_prefix turns that off)");
  // The flag wins over the variable, as in torchrun: one notice, the flag's.
  spec = parse({"--log-line-prefix-template=x", "prog"});
  ASSERT_EQ(spec.notices.size(), 1u);
  EXPECT_NE(spec.notices[0].find("--log_line_prefix_template has no effect"), std::string::npos);
}

TEST(TorchrunCompat, PrintCompletionPrintsAScriptAndExits) {
  auto outcome = parse_launch_args({"ddprun", "--print-completion", "bash"}, false);
  EXPECT_FALSE(outcome.spec);
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_NE(outcome.message.find("complete -o filenames -F _ddprun ddprun"), std::string::npos);
  EXPECT_NE(outcome.message.find("--nproc-per-node"), std::string::npos);
  auto tcsh = parse_launch_args({"ddprun", "--print-completion=tcsh"}, false);
  EXPECT_NE(tcsh.message.find("(help config"), std::string::npos) << tcsh.message;
  EXPECT_THROW(parse_launch_args({"ddprun", "--print-completion=fish"}, false), Error);
}

TEST(TorchrunCompat, RdzvConfKeysTorchrunKeepsAreAcceptedWithNotices) {
  std::vector<std::string> notices;
  RdzvConf conf = parse_rdzv_conf(
      "use_libuv=1,store_type=tcp,my_backend_key=3,keep_alive_interval=5,"
      "keep_alive_max_attempt=3",
      TorchHandler::kC10d, &notices);
  EXPECT_DOUBLE_EQ(conf.heartbeat_timeout_s, 15);
  ASSERT_EQ(notices.size(), 3u);
  EXPECT_NE(notices[0].find("use_libuv=1 has no effect"), std::string::npos);
  EXPECT_NE(notices[1].find("store_type=tcp has no effect"), std::string::npos);
  EXPECT_NE(notices[2].find("my_backend_key=3 has no effect"), std::string::npos);
  // An interval alone at or above the default timeout: torchrun's 3 attempts.
  EXPECT_DOUBLE_EQ(
      parse_rdzv_conf("keep_alive_interval=20", TorchHandler::kC10d).heartbeat_timeout_s, 60);
  EXPECT_THROW(parse_rdzv_conf("join_timeout=soon", TorchHandler::kC10d), Error);
  auto spec = parse({"--rdzv-conf=use_libuv=False", "prog"});
  EXPECT_TRUE(has_notice(spec, "use_libuv=False has no effect"));
}

TEST(TorchrunCompat, ShutdownGraceIsTorchrunsThirtySecondsOrTorchElasticShutdownTimeout) {
  EXPECT_DOUBLE_EQ(parse({"prog"}).shutdown_timeout_s, 30);
  ScopedEnv grace("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "45");
  EXPECT_DOUBLE_EQ(parse({"prog"}).shutdown_timeout_s, 45);
  EXPECT_DOUBLE_EQ(parse({"--shutdown-timeout=2", "prog"}).shutdown_timeout_s, 2);
  ScopedEnv bad("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon");
  EXPECT_NE(error_of({"prog"}).find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon"), std::string::npos);
}

TEST(TorchrunCompat, LocalRanksFilterIgnoresRanksThisNodeLacks) {
  auto spec = parse({"--nproc_per_node=2", "--local-ranks-filter=0,1,2,3", "prog"});
  ASSERT_TRUE(spec.local_ranks_filter);
  EXPECT_EQ(*spec.local_ranks_filter, (std::vector<int>{0, 1}));
  EXPECT_NE(error_of({"--local_ranks_filter=a", "p"}).find("--local_ranks_filter=a"),
            std::string::npos);
  EXPECT_NE(error_of({"--local_ranks_filter=,", "p"}).find("is empty"), std::string::npos);
}

class ProgramFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddprun-programs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    chmod(path.c_str(), 0755);
    return path;
  }
  std::string dir_;
};

TEST_F(ProgramFiles, AFileThatIsNeitherABinaryNorAShebangScriptRunsUnderPython) {
  EXPECT_TRUE(is_python_program(write("train", "import torch\n")));
  EXPECT_TRUE(is_python_program(write("app.pyz", std::string("PK\x03\x04", 4) + "zip")));
  EXPECT_TRUE(is_python_program(dir_ + "/missing.py"));
  EXPECT_FALSE(is_python_program(write("run.sh", "#!/bin/sh\necho hi\n")));
  EXPECT_FALSE(is_python_program(write("tool", std::string("\x7f"
                                                           "ELF\x02\x01",
                                                           6))));
  EXPECT_FALSE(is_python_program("/bin/sh"));
  auto spec = parse({write("trainer", "print('hi')\n"), "--lr=1"});
  EXPECT_EQ(spec.command(),
            (std::vector<std::string>{"python3", "-u", dir_ + "/trainer", "--lr=1"}));
  EXPECT_EQ(parse({"--no-python", dir_ + "/trainer"}).command(),
            (std::vector<std::string>{dir_ + "/trainer"}));
  EXPECT_EQ(parse({"sh", "-c", "true"}).command(), (std::vector<std::string>{"sh", "-c", "true"}));
}

TEST(TorchrunCompat, PythonExecChoosesTheInterpreterAndDdpPythonWins) {
  ScopedEnv exec("PYTHON_EXEC", "/opt/py/bin/python");
  EXPECT_EQ(parse({"t.py"}).command().front(), "/opt/py/bin/python");
  ScopedEnv ours("DDP_PYTHON", "/usr/bin/python3");
  EXPECT_EQ(parse({"t.py"}).command().front(), "/usr/bin/python3");
}

class DeviceTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddprun-devices-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    probe_.dev_root = root_ + "/dev";
    probe_.sys_root = root_ + "/sys";
    probe_.getenv = [this](const char* name) -> const char* {
      auto it = env_.find(name);
      return it == env_.end() ? nullptr : it->second.c_str();
    };
    std::filesystem::create_directories(probe_.dev_root);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void touch(const std::string& path, const std::string& text = "") {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
  }
  void amd_gpus(int n) {
    touch(probe_.dev_root + "/kfd");
    touch(probe_.sys_root + "/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n");  // the CPU node
    for (int i = 1; i <= n; ++i) {
      touch(probe_.sys_root + "/class/kfd/kfd/topology/nodes/" + std::to_string(i) + "/gpu_id",
            std::to_string(1000 + i) + "\n");
    }
  }
  void render_node(int minor, const std::string& driver) {
    const std::string drm =
        probe_.sys_root + "/class/drm/renderD" + std::to_string(minor) + "/device";
    std::filesystem::create_directories(drm);
    std::filesystem::create_directories(root_ + "/drivers/" + driver);
    std::filesystem::create_symlink(root_ + "/drivers/" + driver, drm + "/driver");
  }
  std::string root_;
  DeviceProbe probe_;
  std::map<std::string, std::string> env_;
};

TEST_F(DeviceTree, NvidiaDevicesAndCudaVisibleDevices) {
  EXPECT_EQ(count_gpus(probe_), 0);
  for (const char* name : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"})
    touch(probe_.dev_root + "/" + name);
  EXPECT_EQ(count_gpus(probe_), 2);
  env_["CUDA_VISIBLE_DEVICES"] = "1";
  EXPECT_EQ(count_gpus(probe_), 1);
  env_["CUDA_VISIBLE_DEVICES"] = "0,-1,1";
  EXPECT_EQ(count_gpus(probe_), 1);
}

TEST_F(DeviceTree, RocmGpusAreCountedForGpuAndAuto) {
  amd_gpus(4);
  EXPECT_EQ(count_gpus(probe_), 4);
  EXPECT_EQ(resolve_nproc("gpu", count_gpus(probe_), 64, count_xpus(probe_)), 4);
  EXPECT_EQ(resolve_nproc("auto", count_gpus(probe_), 64, count_xpus(probe_)), 4);
  env_["ROCR_VISIBLE_DEVICES"] = "0,1,2";
  EXPECT_EQ(count_gpus(probe_), 3);
  env_["HIP_VISIBLE_DEVICES"] = "3";
  EXPECT_EQ(count_gpus(probe_), 1);
}

TEST_F(DeviceTree, IntelXpusAreCountedForXpuAndAuto) {
  render_node(128, "i915");
  render_node(129, "xe");
  render_node(130, "amdgpu");  // not an XPU
  EXPECT_EQ(count_xpus(probe_), 2);
  EXPECT_EQ(count_gpus(probe_), 0);
  EXPECT_EQ(resolve_nproc("xpu", 0, 64, count_xpus(probe_)), 2);
  EXPECT_EQ(resolve_nproc("auto", 0, 64, count_xpus(probe_)), 2);
  env_["ZE_AFFINITY_MASK"] = "1";
  EXPECT_EQ(count_xpus(probe_), 1);
  EXPECT_THROW(resolve_nproc("xpu", 0, 64, 0), Error);
  EXPECT_EQ(resolve_nproc("auto", 0, 64, 0), 64);
}

}  // namespace
}  // namespace ddp::launcher
