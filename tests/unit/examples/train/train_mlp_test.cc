// The reference trainer's model (examples/train/mlp.h): its forward and
// backward passes stop at the next layer, or at the next piece of a large
// layer, once a peer of the group is known gone, instead of computing the
// rest of a step that can no longer commit; and a large layer computed in
// pieces gives the gradients of the plain formulas.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ddp/grad_sync.h"
#include "ddp/process_group.h"
#include "ddp/store.h"
#include "mlp.h"

namespace train {
namespace {

using namespace std::chrono_literals;

// Member 0's GradSync over two members, each a thread standing for a node of
// its own (so that a departure is asked of the store), after member 1 left
// the group, as a survivor of a failure does.
std::unique_ptr<ddp::GradSync> sync_after_member_1_left(const std::vector<int>& dims) {
  const auto store = ddp::make_memory_store();
  Mlp mine(dims, 1, false), theirs(dims, 1, false);
  auto join = [&](int rank, Mlp& model) {  // collective: both make their group and GradSync
    return std::async(std::launch::async, [&, rank] {
      ddp::ProcessGroupOptions options = ddp::ProcessGroupOptions::of("gloo");
      options.timeout = 20s;
      options.local_size = 1;
      options.node = rank;
      options.nodes = 2;
      auto group = ddp::ProcessGroup::create(rank, 2, store, options);
      return std::make_unique<ddp::GradSync>(group, model.grad_params());
    });
  };
  auto other = join(1, theirs);
  std::unique_ptr<ddp::GradSync> sync = join(0, mine).get();
  std::unique_ptr<ddp::GradSync> gone = other.get();
  gone->group().abort();
  return sync;
}

void expect_peer_gone(const ddp::Error& e) {
  EXPECT_NE(std::string(e.what()).find("a peer is gone: rank 1 left the group"), std::string::npos)
      << e.what();
}

TEST(MlpBackward, StopsAtTheNextLayerOnceAPeerLeftTheGroup) {
  const std::vector<int> dims = {4, 8, 8, 2};  // three layers
  std::unique_ptr<ddp::GradSync> sync = sync_after_member_1_left(dims);
  Mlp mine(dims, 1);
  const std::vector<float> x(2 * 4, 0.5f);
  mine.forward(x.data(), 2, &sync->group());  // small layers: one piece each, no check
  for (int i = 0; i < 2 * 2; ++i) mine.output_grad()[i] = 0.25f;
  sync->begin_backward();
  try {
    mine.backward(*sync, 1.0f);
    FAIL() << "the backward pass must stop once member 1 left";
  } catch (const ddp::Error& e) {
    expect_peer_gone(e);
  }
  EXPECT_THROW(sync->finish(), ddp::Error);  // its all-reduce cannot complete either
}

// One layer of 70,000 x 64 weights (17.9 MB): two pieces of at most 16 MiB.
const std::vector<int> kOneLargeLayer = {64, 70000};

TEST(MlpForward, StopsWithinALargeLayerOnceAPeerLeftTheGroup) {
  std::unique_ptr<ddp::GradSync> sync = sync_after_member_1_left(kOneLargeLayer);
  Mlp mine(kOneLargeLayer, 1);
  const std::vector<float> x(2 * 64, 0.5f);
  EXPECT_NE(mine.forward(x.data(), 2), nullptr);  // no group to ask: the whole pass
  try {
    mine.forward(x.data(), 2, &sync->group());
    FAIL() << "the forward pass must stop between the pieces of its layer once member 1 left";
  } catch (const ddp::Error& e) {
    expect_peer_gone(e);
  }
}

TEST(MlpBackward, StopsWithinALargeLayerOnceAPeerLeftTheGroup) {
  std::unique_ptr<ddp::GradSync> sync = sync_after_member_1_left(kOneLargeLayer);
  Mlp mine(kOneLargeLayer, 1);
  const std::vector<float> x(2 * 64, 0.5f);
  mine.forward(x.data(), 2);
  for (int i = 0; i < 2 * 70000; ++i) mine.output_grad()[i] = 0.25f;
  sync->begin_backward();
  try {
    mine.backward(*sync, 1.0f);  // one layer: no check between layers, only between pieces
    FAIL() << "the backward pass must stop between the pieces of its layer once member 1 left";
  } catch (const ddp::Error& e) {
    expect_peer_gone(e);
  }
}

// The plain formulas, in double: out = relu(x W^T + b) per hidden layer;
// dW = dz^T in, dz_in = (dz W) through the ReLU of `in`.
struct Reference {
  Mlp& model;
  int batch;
  std::vector<std::vector<double>> acts;  // acts[0] = x, acts[l + 1] = layer l's output

  std::vector<double> layer_out(int l) const {
    const int n_in = model.dims()[l], n_out = model.dims()[l + 1];
    const float* w = model.data(2 * l);
    const float* b = model.data(2 * l + 1);
    std::vector<double> out(static_cast<std::size_t>(batch) * n_out);
    for (int i = 0; i < batch; ++i)
      for (int o = 0; o < n_out; ++o) {
        double sum = b[o];
        for (int k = 0; k < n_in; ++k) sum += acts[l][i * n_in + k] * w[std::size_t(o) * n_in + k];
        out[i * n_out + o] = l + 1 < model.num_layers() ? std::max(sum, 0.0) : sum;
      }
    return out;
  }
  // dLoss/dW of every layer, from dLoss/dOutputs `dz`.
  std::vector<std::vector<double>> weight_grads(std::vector<double> dz) const {
    std::vector<std::vector<double>> grads(model.num_layers());
    for (int l = model.num_layers() - 1; l >= 0; --l) {
      const int n_in = model.dims()[l], n_out = model.dims()[l + 1];
      const float* w = model.data(2 * l);
      grads[l].assign(static_cast<std::size_t>(n_out) * n_in, 0.0);
      for (int i = 0; i < batch; ++i)
        for (int o = 0; o < n_out; ++o)
          for (int k = 0; k < n_in; ++k)
            grads[l][std::size_t(o) * n_in + k] += dz[i * n_out + o] * acts[l][i * n_in + k];
      std::vector<double> below(static_cast<std::size_t>(batch) * n_in, 0.0);
      for (int i = 0; i < batch; ++i)
        for (int k = 0; k < n_in; ++k) {
          double sum = 0;
          for (int o = 0; o < n_out; ++o) sum += dz[i * n_out + o] * w[std::size_t(o) * n_in + k];
          below[i * n_in + k] = acts[l][i * n_in + k] > 0 ? sum : 0.0;
        }
      dz = std::move(below);
    }
    return grads;
  }
};

// The middle layer (15,000 x 300 weights, 18 MB) runs in two pieces, in the
// forward pass, in its gradient and in the gradient it passes down.
TEST(MlpPieces, ALargeLayerInPiecesGivesThePlainFormulasResults) {
  const std::vector<int> dims = {4, 300, 15000, 2};
  const int batch = 2;
  auto store = ddp::make_memory_store();
  auto group = ddp::ProcessGroup::create(0, 1, store, ddp::ProcessGroupOptions::of("gloo"));
  Mlp model(dims, 7);
  ddp::GradSync sync(group, model.grad_params());
  std::vector<float> x(batch * 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 0.8f;

  Reference ref{model, batch, {std::vector<double>(x.begin(), x.end())}};
  for (int l = 0; l < model.num_layers(); ++l) ref.acts.push_back(ref.layer_out(l));
  const float* out = model.forward(x.data(), batch, group.get());
  for (int i = 0; i < batch * 2; ++i) EXPECT_NEAR(out[i], ref.acts.back()[i], 1e-4) << i;

  std::vector<double> dz = {0.5, -0.25, 0.125, 1.0};
  for (int i = 0; i < batch * 2; ++i) model.output_grad()[i] = static_cast<float>(dz[i]);
  sync.begin_backward();
  model.backward(sync, 1.0f);
  sync.finish();
  const auto grads = ref.weight_grads(dz);
  for (int l = 0; l < model.num_layers(); ++l) {
    const float* got = sync.grad_view(2 * static_cast<std::size_t>(l));
    double worst = 0, largest = 0;
    for (std::size_t k = 0; k < grads[l].size(); ++k) {
      worst = std::max(worst, std::abs(got[k] - grads[l][k]));
      largest = std::max(largest, std::abs(grads[l][k]));
    }
    EXPECT_GT(largest, 0.0) << "layer " << l;
    EXPECT_LE(worst, 1e-4 * std::max(largest, 1.0)) << "layer " << l;
  }
}

}  // namespace
}  // namespace train
