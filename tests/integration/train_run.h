#pragma once
// What the reference trainer's integration tests share (train_test.cc on the
// CPU, train_gpu_test.cc on the GPU): ddprun starting `train` (or
// train_fault_worker) with the tests' environment, and reading its loss curve.

#include <map>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {

extern const std::string kTrain;
extern const std::string kFaultWorker;  // train with a rank that dies or hangs

// A small model and run: well under a second per rank.
extern const std::vector<std::string> kSmall;
// 150 steps of regression (expect_loss_decreases' run).
extern const std::vector<std::string> kLearn;

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b);

// ddprun LAUNCHER_ARGS PROGRAM TRAIN_ARGS, waited for (2 minutes at most);
// `env` replaces the defaults (a 30 s group timeout, debug checks, one
// OpenBLAS thread).
ProcessResult train_with(const std::vector<std::string>& launcher_args,
                         const std::vector<std::string>& train_args,
                         const std::map<std::string, std::string>& env = {},
                         const std::string& program = kTrain);
ProcessResult train_on(int nproc, const std::vector<std::string>& args,
                       const std::string& program = kTrain);

// "[rank 0] step K/T | epoch E | loss X | ..." -> K -> X. A later line for the
// same step (a restarted attempt) replaces an earlier one.
std::map<int, double> losses(const std::string& out);
// The summary's final loss (a test failure, and NaN, when there is none).
double final_loss(const ProcessResult& r);
void expect_ok(const ProcessResult& r);
double relative(double a, double b);
// Every step of `expected` in `actual`, within `tolerance` relative.
void expect_same_curve(const std::map<int, double>& expected, const std::map<int, double>& actual,
                       double tolerance, const std::string& what);
// kLearn's 150 steps: the last 10 average under half the first 10.
void expect_loss_decreases(const ProcessResult& r);

}  // namespace ddp::testing
