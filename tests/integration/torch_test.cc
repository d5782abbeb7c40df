// ddprun as a drop-in for torchrun: a real PyTorch DDP program
// (examples/torch/train_ddp.py) under Debian's python3 with its torch.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "debian_torch.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kTrainScript = TORCH_TRAIN_SCRIPT;

ProcessResult ddprun_torch(std::vector<std::string> args) {
  args.insert(args.begin(), kDdprun);
  return run_process(args, {{"DDP_PYTHON", kDebianPython}}, 120s);
}

TEST(TorchDropIn, DdpTrainingFinishesWithTheSameWeightsOnEveryRank) {
  if (auto reason = torch_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto r = ddprun_torch({"--nproc_per_node=2", kTrainScript, "--epochs", "2"});
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

TEST(TorchDropIn, CrashedRankIsReportedWithItsPythonTraceback) {
  if (auto reason = torch_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  auto r = ddprun_torch({"--nproc_per_node=2", kTrainScript, "--crash-rank", "1"});
  ASSERT_TRUE(r.exited) << "ddprun did not finish in time\n" << r.out << r.err;
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.code, 1)
      << "a Python exception exits 1, and ddprun exits with the failed worker's code";
  // The report (not just the live [rank 1] lines) names rank 1 and quotes its traceback.
  auto report_at = r.err.find("worker failed: rank 1 ");
  ASSERT_NE(report_at, std::string::npos) << r.err;
  auto report = r.err.substr(report_at);
  EXPECT_NE(report.find("exit code 1"), std::string::npos) << report;
  EXPECT_NE(report.find("| Traceback (most recent call last):"), std::string::npos) << report;
  EXPECT_NE(report.find("| RuntimeError: deliberate failure on rank 1"), std::string::npos)
      << report;
  EXPECT_EQ(r.out.find("FINAL_WEIGHTS"), std::string::npos) << "no rank may finish training\n"
                                                            << r.out;
}

}  // namespace
}  // namespace ddp::testing
