// What GradSync's thread-rank unit tests share: Gloo groups with every rank a
// thread of the test process over one in-memory store, the reference MLP whose
// gradients are computed analytically (in double), and the checks of a
// GradSync's gradients against them.
#pragma once

#include <gtest/gtest.h>

#include "visible_gpus.h"

#include "thread_ranks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/ddp_c.h"
#include "ddp/grad_sync.h"
#include "ddp/log.h"
#include "error_of.h"
#include "reference_mlp.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ddp::grad_sync_test {

using namespace std::chrono_literals;

// ------------------------------------------------------------ ranks as threads

using ::ddp::testing::gloo_options;
using ::ddp::testing::on_ranks;

using ::ddp::testing::error_of;

inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ------------------------------------------------------------ an MLP with analytic gradients

// The unit tests' reference model: 7 inputs, hidden 13 and 11, 5 outputs.
inline const std::vector<int> kMlpSizes = {7, 13, 11, 5};

using ::ddp::testing::backward_order;
using ::ddp::testing::Batch;
using ::ddp::testing::make_batch;
using ::ddp::testing::Mlp;
using ::ddp::testing::mlp_grads;
using ::ddp::testing::mlp_params;

inline std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// How a rank hands a gradient to GradSync.
enum class Path { kView, kSet, kAdd };

inline void write_grad(GradSync& sync, std::size_t p, const std::vector<double>& g, Path path) {
  std::vector<float> f = to_float(g);
  switch (path) {
    case Path::kView:
      std::copy(f.begin(), f.end(), sync.grad_view(p));
      break;
    case Path::kSet:
      sync.set_grad(p, f.data());
      break;
    case Path::kAdd:
      sync.add_grad(p, f.data());
      break;
  }
}

// float32 results against the double reference: each rank's gradient is
// rounded to float once and the mean adds a few roundings, so 1e-6 absolute
// plus 1e-5 relative is far above the error and far below any real mistake.
constexpr double kAbsTol = 1e-6;
constexpr double kRelTol = 1e-5;

inline void expect_grads(GradSync& sync, const std::vector<std::vector<double>>& want,
                         const std::string& what) {
  for (std::size_t p = 0; p < want.size(); ++p) {
    const float* got = sync.grad_view(p);
    for (std::size_t i = 0; i < want[p].size(); ++i) {
      double tol = kAbsTol + kRelTol * std::abs(want[p][i]);
      if (std::abs(got[i] - want[p][i]) > tol) {
        ADD_FAILURE() << what << ": " << sync.param(p).name << "[" << i << "] is " << got[i]
                      << ", expected " << want[p][i];
        return;
      }
    }
  }
}

inline std::vector<float> all_grads(GradSync& sync) {
  std::vector<float> out;
  for (std::size_t p = 0; p < sync.num_params(); ++p) {
    const float* g = sync.grad_view(p);
    out.insert(out.end(), g, g + sync.param(p).count());
  }
  return out;
}

// Three parameters of 4 elements each, for the unused-parameter and check tests.
inline std::vector<GradParam> three_params() {
  return {{"fc1.weight", {4}}, {"fc2.bias", {4}}, {"fc3.weight", {4}}};
}

}  // namespace ddp::grad_sync_test
