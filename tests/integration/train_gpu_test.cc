// The reference trainer's GPU path (--backend nccl) under ddprun: it runs
// where the build has it and GPUs are visible, and skips with the reason
// elsewhere; without a GPU only its refusal is tested. A GPU sums in another
// order than OpenBLAS, so GPU and CPU curves are compared at 1e-3 relative;
// GPU runs among themselves, at 1e-4 like the CPU ones (train_test.cc).

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "train_gpu_probe.h"
#include "train_run.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

const GpuProbe& gpu_probe() { return train_gpu_probe(kTrain); }

#define REQUIRE_GPUS(n) REQUIRE_TRAIN_GPUS(kTrain, n)

const std::vector<std::string> kGpu = {"--backend", "nccl"};

TEST(TrainGpu, BackendNcclIsAOneLineFlagErrorWithoutTheGpuPathOrAGpu) {
  const GpuProbe& probe = gpu_probe();
  if (probe.gpus > 0) GTEST_SKIP() << "a GPU is visible: --backend nccl runs here";
  const std::string why = probe.built ? "no CUDA device is visible" : "has no GPU path";
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string names;
  };
  const std::vector<Case> cases = {
      {kGpu, {{"DDP_BACKEND", "\x01"}}, "--backend nccl: "},
      {{}, {{"DDP_BACKEND", "nccl"}}, "DDP_BACKEND=nccl: "},
      // Checked before the device: GradSync compresses host buckets only.
      {kGpu + std::vector<std::string>{"--compression", "fp16"},
       {{"DDP_BACKEND", "\x01"}},
       probe.built ? "--compression fp16 with --backend nccl" : "--backend nccl: "},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {kTrain};
    argv = argv + c.args;
    auto r = run_process(argv, c.env, 30s);
    ASSERT_TRUE(r.exited);
    EXPECT_EQ(r.code, 2) << c.names << ": " << r.err;
    EXPECT_EQ(r.err.rfind("train: error: " + c.names, 0), 0u) << r.err;
    if (c.names.back() == ' ') {
      EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
    }
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // Under ddprun every rank fails at once, before any collective.
  auto r = train_on(2, kSmall + kGpu);
  ASSERT_TRUE(r.exited) << r.out << r.err;
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--backend nccl: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
}

TEST(TrainGpu, OneGpuFollowsTheCpuLossCurve) {
  REQUIRE_GPUS(1);
  for (const char* task : {"classification", "regression"}) {
    const auto args = kSmall + std::vector<std::string>{"--task", task,    "--optimizer",  "adam",
                                                        "--lr",   "0.003", "--batch_size", "64"};
    auto cpu = train_on(1, args);
    expect_ok(cpu);
    auto gpu = train_on(1, args + kGpu);
    expect_ok(gpu);
    EXPECT_NE(gpu.out.find("math on cuda:0"), std::string::npos) << gpu.out;
    auto reference = losses(cpu.out);
    ASSERT_EQ(reference.size(), 30u) << cpu.out;
    expect_same_curve(reference, losses(gpu.out), 1e-3, std::string(task) + ": GPU vs CPU");
  }
}

TEST(TrainGpu, LossDecreasesOnTwoGpus) {
  REQUIRE_GPUS(2);
  auto r = train_on(2, kLearn + kGpu);
  expect_ok(r);
  EXPECT_NE(r.out.find("2 rank(s) (nccl)"), std::string::npos) << r.out;
  expect_loss_decreases(r);
}

// The ranks agree: with the global batch fixed, two GPUs (NCCL reducing the
// device buckets, also after no_sync micro-batches) follow one GPU's curve.
TEST(TrainGpu, TwoGpusFollowTheOneGpuLossCurve) {
  REQUIRE_GPUS(2);
  const auto args =
      kGpu + kSmall + std::vector<std::string>{"--optimizer", "adam", "--lr", "0.003"};
  auto one = train_on(1, args + std::vector<std::string>{"--batch_size", "64"});
  expect_ok(one);
  auto reference = losses(one.out);
  ASSERT_EQ(reference.size(), 30u) << one.out;
  auto two = train_on(2, args + std::vector<std::string>{"--batch_size", "32"});
  expect_ok(two);
  expect_same_curve(reference, losses(two.out), 1e-4, "2 GPUs vs 1");
  auto accumulated =
      train_on(2, args + std::vector<std::string>{"--batch_size", "16", "--accumulate", "2"});
  expect_ok(accumulated);
  expect_same_curve(reference, losses(accumulated.out), 1e-4, "2 GPUs, accumulate 2 x 16 vs 1");
}

// One checkpoint format: a GPU run's checkpoint resumes on the CPU and a CPU
// run's on the GPU (on 2 GPUs, where rank 0 broadcasts it on the devices).
TEST(TrainGpu, CheckpointsMoveBetweenCpuAndGpu) {
  REQUIRE_GPUS(1);
  const int n = gpu_probe().gpus >= 2 ? 2 : 1;
  const std::string dir = make_temp_dir();
  const auto args =
      kSmall + std::vector<std::string>{"--optimizer", "adam",         "--lr",
                                        "0.003",       "--batch_size", std::to_string(64 / n)};
  auto cpu_whole = train_on(n, args);
  expect_ok(cpu_whole);
  auto gpu_whole = train_on(n, args + kGpu);
  expect_ok(gpu_whole);
  struct Leg {
    std::vector<std::string> first, then;
    const ProcessResult* whole;
    std::string what;
  };
  const std::vector<Leg> legs = {{kGpu, {}, &cpu_whole, "GPU checkpoint resumed on the CPU"},
                                 {{}, kGpu, &gpu_whole, "CPU checkpoint resumed on the GPU"}};
  for (const auto& leg : legs) {
    const std::string ckpt = dir + "/" + std::to_string(&leg - legs.data()) + ".ckpt";
    auto first = train_on(
        n, args + leg.first + std::vector<std::string>{"--steps", "10", "--checkpoint", ckpt});
    expect_ok(first);
    auto resumed = train_on(n, args + leg.then + std::vector<std::string>{"--resume", ckpt});
    expect_ok(resumed);
    EXPECT_NE(resumed.out.find("resumed from " + ckpt + " at step 10"), std::string::npos)
        << leg.what << "\n"
        << resumed.out;
    auto expected = losses(leg.whole->out);
    auto curve = losses(resumed.out);
    ASSERT_EQ(curve.begin()->first, 11) << leg.what << "\n" << resumed.out;
    for (auto& [step, loss] : curve) {
      EXPECT_LE(relative(loss, expected[step]), 1e-3) << leg.what << ": step " << step;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp::testing
