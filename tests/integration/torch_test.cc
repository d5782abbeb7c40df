// ddprun as a drop-in for torchrun: a real PyTorch DDP program
// (examples/torch/train_ddp.py) under the torch 2.x environment
// (torch_env.h), and once more under Debian's python3 with its torch 1.13,
// the oldest torch ddprun is run with.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "debian_torch.h"
#include "run_ddprun.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kTrainScript = TORCH_TRAIN_SCRIPT;

ProcessResult ddprun_torch(const std::string& python, std::vector<std::string> args) {
  return ddprun(args, {{"DDP_PYTHON", python}}, 120s);
}

// train_ddp.py --epochs 2 on 2 ranks: it ran to the end, both ranks printed
// the same final weights, rank 0 (only) logged each epoch.
void expect_same_weights_on_both_ranks(const ProcessResult& r) {
  ASSERT_TRUE(r.exited) << "ddprun did not finish in time\n" << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;

  std::map<int, std::string> weights;  // rank -> "sum=... abs_sum=..."
  for (int rank = 0; rank < 2; ++rank) {
    auto prefix =
        "[rank " + std::to_string(rank) + "] FINAL_WEIGHTS rank=" + std::to_string(rank) + " ";
    auto lines = lines_with_prefix(r.out, prefix);
    ASSERT_EQ(lines.size(), 1u) << "rank " << rank << " printed no (or several) checksums\n"
                                << r.out;
    weights[rank] = lines[0];
  }
  EXPECT_NE(weights[0].find("sum="), std::string::npos) << weights[0];
  EXPECT_EQ(weights[0], weights[1]) << "DDP replicas diverged";
  // Loss is logged by rank 0 only, once per epoch.
  EXPECT_EQ(lines_with_prefix(r.out, "[rank 0] epoch ").size(), 2u) << r.out;
  EXPECT_TRUE(lines_with_prefix(r.out, "[rank 1] epoch ").empty()) << r.out;
}

TEST(TorchDropIn, DdpTrainingFinishesWithTheSameWeightsOnEveryRank) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  expect_same_weights_on_both_ranks(
      ddprun_torch(torch2_python(), {"--nproc_per_node=2", kTrainScript, "--epochs", "2"}));
}

// Debian's torch 1.13: its env:// init, Gloo and DDP predate torch 2's.
TEST(TorchDropIn, DebianTorch113DdpTrainingFinishesWithTheSameWeightsOnEveryRank) {
  if (auto reason = torch_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  expect_same_weights_on_both_ranks(
      ddprun_torch(kDebianPython, {"--nproc_per_node=2", kTrainScript, "--epochs", "2"}));
}

TEST(TorchDropIn, CrashedRankIsReportedWithItsPythonTraceback) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto r = ddprun_torch(torch2_python(), {"--nproc_per_node=2", kTrainScript, "--crash-rank", "1"});
  ASSERT_TRUE(r.exited) << "ddprun did not finish in time\n" << r.out << r.err;
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.code, 1)
      << "a Python exception exits 1, and ddprun exits with the failed worker's code";
  // The report (not just the live [rank 1] lines) names rank 1 and quotes its traceback.
  auto report_at = r.err.find("worker failed: rank 1 ");
  ASSERT_NE(report_at, std::string::npos) << r.err;
  auto report = r.err.substr(report_at);
  EXPECT_NE(report.find("exit code 1"), std::string::npos) << report;
  // The quoted stderr lines ("  | ..."); torch 2 prefixes an uncaught exception's
  // lines with "[rank1]: " once the process group is up.
  auto quoted = lines_with_prefix(report, "  | ");
  auto quotes_line_ending = [&](const std::string& tail) {
    return std::any_of(quoted.begin(), quoted.end(), [&](const std::string& line) {
      return line.size() >= tail.size() &&
             line.compare(line.size() - tail.size(), tail.size(), tail) == 0;
    });
  };
  EXPECT_TRUE(quotes_line_ending("Traceback (most recent call last):")) << report;
  EXPECT_TRUE(quotes_line_ending("RuntimeError: deliberate failure on rank 1")) << report;
  EXPECT_EQ(r.out.find("FINAL_WEIGHTS"), std::string::npos) << "no rank may finish training\n"
                                                            << r.out;
}

}  // namespace
}  // namespace ddp::testing
