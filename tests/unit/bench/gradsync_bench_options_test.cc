// gradsync_bench's command line: the parser's checks, and the program itself
// refusing a bad flag or --device where it cannot run.

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gradsync_bench_options.h"
#include "subprocess.h"

namespace {

bench::GradSyncBenchArgs parse(std::vector<const char*> args) {
  args.insert(args.begin(), "gradsync_bench");
  return bench::parse_gradsync_bench_args(static_cast<int>(args.size()), args.data());
}

TEST(GradSyncBenchArgs, DefaultsMeasureTheHostModel) {
  const auto a = parse({});
  ASSERT_EQ(a.error, "");
  EXPECT_FALSE(a.config.device);
  EXPECT_EQ(a.config.layers, 4);
  EXPECT_EQ(a.config.width, 888);
  EXPECT_TRUE(a.config.shared);
}

TEST(GradSyncBenchArgs, DeviceTakesTheLargerModelUnlessFlagsSayOtherwise) {
  auto a = parse({"--device"});
  ASSERT_EQ(a.error, "");
  EXPECT_TRUE(a.config.device);
  EXPECT_EQ(a.config.layers, bench::kDeviceLayers);
  EXPECT_EQ(a.config.width, bench::kDeviceWidth);
  EXPECT_EQ(a.config.batch, bench::kDeviceBatch);
  EXPECT_FALSE(a.config.shared);  // host memory only
  // A flag wins wherever it stands, before or after --device.
  a = parse({"--width", "512", "--device", "--layers", "2"});
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.config.width, 512);
  EXPECT_EQ(a.config.layers, 2);
  EXPECT_EQ(a.config.batch, bench::kDeviceBatch);
}

TEST(GradSyncBenchArgs, ListsAndNumbersAreReadWhole) {
  const auto a = parse({"--caps", "1,2.5,0", "--inline_caps", "", "--first", "0.5"});
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.config.caps_mib, (std::vector<double>{1, 2.5, 0}));
  EXPECT_TRUE(a.config.inline_caps_mib.empty());
  EXPECT_DOUBLE_EQ(a.config.first_mib, 0.5);
}

TEST(GradSyncBenchArgs, EachBadInputNamesItsFlag) {
  struct Case {
    std::vector<const char*> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--layers", "4x"}, "--layers must be a whole number from 1 to 1000000, not '4x'"},
      {{"--width", "0"}, "--width must be a whole number from 1 to 1000000, not '0'"},
      {{"--warmup", "-1"}, "--warmup must be a whole number from 0 to 1000000, not '-1'"},
      {{"--steps"}, "--steps needs a value"},
      {{"--caps", "1,,4"},
       "--caps must be a list of sizes in MiB like 1,4,25 (0: no overlap), "
       "not '1,,4'"},
      {{"--caps", "4,"},
       "--caps must be a list of sizes in MiB like 1,4,25 (0: no overlap), "
       "not '4,'"},
      {{"--first", "0"}, "--first must be a number above 0, not '0'"},
      {{"--shared", "yes"}, "--shared must be 0 or 1, not 'yes'"},
      {{"--compression", "int8"}, "--compression must be none, fp16 or bf16, not 'int8'"},
      {{"--devices", "1"}, "unknown flag '--devices' (see --help)"},
      {{"extra"}, "unknown argument 'extra' (see --help)"},
      {{"--device", "--compression", "fp16"},
       "--compression is for host buckets; --device buckets are never compressed"},
      {{"--caps", "", "--inline_caps", "", "--shared", "0"},
       "nothing to measure: --caps and --inline_caps are empty and --shared is 0"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(parse(c.args).error, c.error) << c.args[0];
  }
  EXPECT_TRUE(parse({"--help"}).help);
}

// The program: usage errors exit 64 before anything starts; --device on a
// machine without a GPU says so and exits 1.
TEST(GradSyncBenchProgram, RefusesABadFlagWithExit64) {
  const auto r = ddp::testing::run_process({GRADSYNC_BENCH_PATH, "--rounds", "two"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 64);
  EXPECT_NE(r.err.find("--rounds must be a whole number"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("usage: gradsync_bench"), std::string::npos) << r.err;
}

TEST(GradSyncBenchProgram, DeviceWithoutAGpuSaysSo) {
  if (access("/dev/nvidia0", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0) {
    GTEST_SKIP() << "this machine has an NVIDIA device: the GPU check (gpu-check.sh) runs --device";
  }
  const auto r = ddp::testing::run_process({GRADSYNC_BENCH_PATH, "--device", "--rounds", "1"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(r.err.find("gradsync_bench: error: --device: no CUDA device here") !=
                  std::string::npos ||
              r.err.find("gradsync_bench: error: --device: this gradsync_bench was built "
                         "without CUDA") != std::string::npos)
      << r.err;
}

TEST(GradSyncBenchProgram, HostRunOfOneRankPrintsItsTable) {
  const auto r = ddp::testing::run_process(
      {GRADSYNC_BENCH_PATH, "--layers", "2", "--width", "16", "--batch", "4", "--rounds", "1",
       "--steps", "2", "--warmup", "1", "--caps", "1,0", "--inline_caps", "", "--shared", "0"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 layers of 16x16 + bias (544 params"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no-overlap"), std::string::npos) << r.out;
}

}  // namespace
