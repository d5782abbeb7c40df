// The activation exchange's pure part (row_exchange.h) and Mlp::backward_rows
// with every rank a thread: one process's memory stands for the node's shared
// block and a std::barrier for the group's.
//
// Tolerance: the exchange sums a weight gradient's terms over all ranks'
// rows in one GEMM, the reference over one batch holding the same rows; both
// add the same float products, possibly in another order: 1e-5 relative.

#include <cblas.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "mlp.h"
#include "row_exchange.h"

namespace train {
namespace {

TEST(OwnedRows, EveryRowHasExactlyOneOwnerAndSharesDifferByAtMostOne) {
  for (int world = 1; world <= 5; ++world) {
    for (int rows = 0; rows <= 23; ++rows) {
      int next = 0, smallest = rows, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        const RowRange mine = owned_rows(rows, world, rank);
        EXPECT_EQ(mine.begin, next) << rows << " rows, rank " << rank << " of " << world;
        EXPECT_GE(mine.size(), 0);
        next = mine.end;
        smallest = std::min(smallest, mine.size());
        largest = std::max(largest, mine.size());
      }
      EXPECT_EQ(next, rows) << rows << " rows, " << world << " ranks";
      EXPECT_LE(largest - smallest, 1) << rows << " rows, " << world << " ranks";
    }
  }
  EXPECT_TRUE(owned_rows(1, 2, 0).empty());  // fewer rows than ranks: the first rank has none
  EXPECT_EQ(owned_rows(1, 2, 1).size(), 1);
}

TEST(OwnedRows, BadArgumentsAreErrorsNamingThem) {
  EXPECT_THROW(owned_rows(4, 0, 0), ddp::Error);
  EXPECT_THROW(owned_rows(4, 2, 2), ddp::Error);
  EXPECT_THROW(owned_rows(4, 2, -1), ddp::Error);
  EXPECT_THROW(owned_rows(-1, 2, 0), ddp::Error);
  try {
    owned_rows(4, 2, 5);
    FAIL();
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5 of 2"), std::string::npos) << e.what();
  }
}

TEST(OwnedElements, AreTheOwnedRowsOfTheWeightAndOfTheBias) {
  const std::vector<int> dims = {7, 10, 3};  // fc1: 10 x 7, fc2: 3 x 7... x 10
  EXPECT_EQ(owned_elements(dims, 0, 2, 0).begin, 0u);
  EXPECT_EQ(owned_elements(dims, 0, 2, 0).end, 5u * 7);
  EXPECT_EQ(owned_elements(dims, 0, 2, 1).begin, 5u * 7);
  EXPECT_EQ(owned_elements(dims, 0, 2, 1).end, 10u * 7);
  EXPECT_EQ(owned_elements(dims, 1, 2, 1).begin, 5u);
  EXPECT_EQ(owned_elements(dims, 1, 2, 1).end, 10u);
  EXPECT_EQ(owned_elements(dims, 2, 2, 0).size(), 1u * 10);  // 3 rows: 1 and 2
  EXPECT_EQ(owned_elements(dims, 2, 2, 1).size(), 2u * 10);
  EXPECT_EQ(owned_elements(dims, 3, 2, 1).size(), 2u);
  EXPECT_THROW(owned_elements(dims, 4, 2, 0), ddp::Error);
}

// dLoss/dOutputs the tests use: any fixed function of the outputs.
void fake_output_grad(const float* out, int rows, int width, float* grad) {
  for (int i = 0; i < rows * width; ++i)
    grad[i] = std::sin(3.0f * out[i]) + 0.01f * static_cast<float>(i % width);
}

std::vector<float> inputs(int rows, int width) {
  std::vector<float> x(static_cast<std::size_t>(rows) * width);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.37f * static_cast<float>(i)) - 0.2f;
  return x;
}

struct Gradients : GradSink {
  explicit Gradients(const Mlp& model) {
    for (std::size_t p = 0; p < model.num_tensors(); ++p) values.emplace_back(model.count(p), 0.0f);
  }
  float* grad(std::size_t param) override { return values[param].data(); }
  void ready(std::size_t) override {}
  std::vector<std::vector<float>> values;
};

void expect_close(float actual, float expected, const std::string& what) {
  EXPECT_LE(std::fabs(actual - expected), 1e-5f * std::max(1.0f, std::fabs(expected))) << what;
}

class BackwardRows : public ::testing::TestWithParam<int> {};

// N ranks, `batch` rows each, end with their rows of the gradient that one
// model computes on all N * batch rows; the rows they do not own are not
// written; accumulating adds.
TEST_P(BackwardRows, EachRankGetsItsRowsOfTheWholeBatchGradient) {
  openblas_set_num_threads(1);
  const int world = GetParam(), batch = 3;
  const std::vector<int> dims = {6, 9, 11, 4};
  const float scale = 0.25f;
  const std::vector<float> x = inputs(world * batch, dims[0]);

  Mlp whole(dims, 7);
  const float* whole_out =
      whole.forward(x.data(), world * batch);  // before output_grad(): it sizes it
  fake_output_grad(whole_out, world * batch, dims.back(), whole.output_grad());
  Gradients expected(whole);
  whole.backward(expected, scale, false);

  // The node's shared memory, and its barrier.
  std::vector<std::vector<float>> input_blocks, grad_blocks;
  ExchangeBlocks shared;
  shared.world = world;
  shared.batch = batch;
  for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
    input_blocks.emplace_back(static_cast<std::size_t>(world * batch) * dims[l], NAN);
    grad_blocks.emplace_back(static_cast<std::size_t>(world * batch) * dims[l + 1], NAN);
    shared.inputs.push_back(input_blocks.back().data());
    shared.grads.push_back(grad_blocks.back().data());
  }
  std::barrier all(world);
  constexpr float kUntouched = 12345.0f;
  std::vector<std::vector<std::vector<float>>> got(world);  // [rank][param]
  std::vector<std::vector<std::vector<float>>> twice(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      ExchangeBlocks blocks = shared;
      blocks.rank = r;
      blocks.wait_for_all = [&all] { all.arrive_and_wait(); };
      Mlp model(dims, 7);
      model.bind_exchange(&blocks);
      const float* mine = x.data() + static_cast<std::size_t>(r) * batch * dims[0];
      const float* out = model.forward(mine, batch);
      fake_output_grad(out, batch, dims.back(), model.output_grad());
      std::vector<std::vector<float>> grads;
      std::vector<float*> pointers;
      for (std::size_t p = 0; p < model.num_tensors(); ++p)
        grads.emplace_back(model.count(p), kUntouched);
      for (auto& g : grads) pointers.push_back(g.data());
      model.backward_rows(pointers, scale, false);
      got[r] = grads;
      model.backward_rows(pointers, scale, true);  // the same batch again, added
      twice[r] = grads;
    });
  }
  for (auto& t : ranks) t.join();

  for (int r = 0; r < world; ++r) {
    for (std::size_t p = 0; p < expected.values.size(); ++p) {
      const ddp::ElementRange mine = owned_elements(dims, p, world, r);
      for (std::size_t i = 0; i < expected.values[p].size(); ++i) {
        const std::string what = "rank " + std::to_string(r) + " param " + std::to_string(p) +
                                 " element " + std::to_string(i);
        if (i >= mine.begin && i < mine.end) {
          expect_close(got[r][p][i], expected.values[p][i], what);
          expect_close(twice[r][p][i], 2 * expected.values[p][i], what + " (accumulated)");
        } else {
          EXPECT_EQ(got[r][p][i], kUntouched) << what;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, BackwardRows, ::testing::Values(1, 2, 3, 5),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(BackwardRows, MisuseIsAnErrorNamingIt) {
  const std::vector<int> dims = {4, 5, 2};
  Mlp model(dims, 1);
  std::vector<float*> none;
  EXPECT_THROW(model.backward_rows(none, 1.0f, false), ddp::Error);  // nothing bound
  std::vector<float> in(2 * 4), h(2 * 5), g1(2 * 5), g2(2 * 2);
  ExchangeBlocks blocks;
  blocks.batch = 2;
  blocks.inputs = {in.data(), h.data()};
  blocks.grads = {g1.data(), g2.data()};
  blocks.wait_for_all = [] {};
  model.bind_exchange(&blocks);
  const std::vector<float> x(3 * 4, 0.5f);
  try {
    model.forward(x.data(), 3);
    FAIL();
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a batch of 3 rows"), std::string::npos) << e.what();
  }
  model.forward(x.data(), 2);
  Gradients sink(model);
  EXPECT_THROW(model.backward(sink, 1.0f, false), ddp::Error);       // the exchange is bound
  EXPECT_THROW(model.backward_rows(none, 1.0f, false), ddp::Error);  // wrong buffer count
}

}  // namespace
}  // namespace train
