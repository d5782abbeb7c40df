#include "train_run.h"

#include "run_ddprun.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ddp::testing {

using namespace std::chrono_literals;

const std::string kTrain = TRAIN_PATH;
const std::string kFaultWorker = TRAIN_FAULT_WORKER_PATH;

const std::vector<std::string> kSmall = {"--hidden", "64", "--layers",    "3",
                                         "--steps",  "30", "--log_every", "1"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ProcessResult train_with(const std::vector<std::string>& launcher_args,
                         const std::vector<std::string>& train_args,
                         const std::map<std::string, std::string>& env,
                         const std::string& program) {
  std::vector<std::string> argv = launcher_args;
  argv.push_back(program);
  argv = argv + train_args;
  std::map<std::string, std::string> full = {
      {"DDP_BACKEND", "\x01"},    {"DDP_DEBUG", "\x01"},     {"DDP_TIMEOUT_S", "30"},
      {"DDP_GLOO_IFACE", "\x01"}, {"DDP_LOG_LEVEL", "\x01"}, {"OPENBLAS_NUM_THREADS", "1"}};
  for (const auto& [name, value] : env) full[name] = value;
  return ddprun(argv, full, 120s);
}

ProcessResult train_on(int nproc, const std::vector<std::string>& args,
                       const std::string& program) {
  return train_with({"--nproc_per_node=" + std::to_string(nproc)}, args, {}, program);
}

std::map<int, double> losses(const std::string& out) {
  std::map<int, double> result;
  for (const auto& line : lines_with_prefix(out, "[rank 0] step ")) {
    const int step = std::stoi(line);
    const auto at = line.find("| loss ");
    if (at == std::string::npos) continue;
    result[step] = std::stod(line.substr(at + 7));
  }
  return result;
}

double final_loss(const ProcessResult& r) {
  for (const auto& line : lines_with_prefix(r.out, "[rank 0] summary: ")) {
    const auto at = line.find("final loss ");
    if (at != std::string::npos) return std::stod(line.substr(at + 11));
  }
  ADD_FAILURE() << "no final loss in the output:\n" << r.out << r.err;
  return NAN;
}

void expect_ok(const ProcessResult& r) {
  ASSERT_TRUE(r.exited) << "did not finish in time\n" << r.out << r.err;
  ASSERT_EQ(r.code, 0) << r.out << r.err;
}

double relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

void expect_same_curve(const std::map<int, double>& expected, const std::map<int, double>& actual,
                       double tolerance, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (const auto& [step, loss] : expected) {
    ASSERT_TRUE(actual.count(step)) << what << ": no loss for step " << step;
    EXPECT_LE(relative(actual.at(step), loss), tolerance)
        << what << ": step " << step << " loss " << actual.at(step) << " vs " << loss;
  }
}

const std::vector<std::string> kLearn = {"--hidden", "64",         "--layers",    "3",
                                         "--steps",  "150",        "--log_every", "1",
                                         "--task",   "regression", "--lr",        "0.1"};

void expect_loss_decreases(const ProcessResult& r) {
  auto curve = losses(r.out);
  ASSERT_EQ(curve.size(), 150u) << r.out;
  // Mean of the first and last 10 steps (single steps are noisy).
  double first = 0, last = 0;
  for (int s = 1; s <= 10; ++s) first += curve[s] / 10;
  for (int s = 141; s <= 150; ++s) last += curve[s] / 10;
  EXPECT_LT(last, 0.5 * first) << r.out;
  EXPECT_NEAR(final_loss(r), curve[150], 1e-8);
}

}  // namespace ddp::testing
