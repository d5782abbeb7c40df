// The activation exchange's pure part (row_exchange.h), Mlp::backward_chain
// and Mlp::weight_rows with every rank a thread (one process's memory stands
// for the node's shared block, a std::barrier for the group's), and the
// optimizer's state moved into caller-owned memory.
//
// Tolerance: the exchange sums a weight gradient's terms over all ranks'
// rows in one GEMM, the reference over one batch holding the same rows; both
// add the same float products, possibly in another order: 1e-5 relative.

#include <cblas.h>
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <functional>
#include <latch>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/common/error.h"
#include "flags.h"
#include "mlp.h"
#include "optimizer.h"
#include "row_exchange.h"

namespace train {
namespace {

TEST(ExchangeUnits, CoverEveryRowOnceLastLayerFirstAtLeastTheMinimumRows) {
  const std::vector<int> dims = {7, 10, 3, 5};
  for (int world = 1; world <= 4; ++world) {
    for (int min_rows = 1; min_rows <= 12; ++min_rows) {
      const std::string what = std::to_string(world) + " ranks, min " + std::to_string(min_rows);
      const std::vector<ExchangeUnit> units = exchange_units(dims, world, min_rows);
      int layer = static_cast<int>(dims.size()) - 2, next_row = 0;
      for (const ExchangeUnit& u : units) {
        if (u.layer != layer) {
          EXPECT_EQ(next_row, dims[layer + 1]) << "layer " << layer << ", " << what;
          EXPECT_EQ(u.layer, layer - 1) << what;
          layer = u.layer;
          next_row = 0;
        }
        EXPECT_EQ(u.rows.begin, next_row) << "layer " << layer << ", " << what;
        EXPECT_GE(u.rows.size(), 1);
        // Fewer than the minimum only where the layer ends.
        if (u.rows.end < dims[layer + 1]) {
          EXPECT_GE(u.rows.size(), min_rows) << what;
        }
        next_row = u.rows.end;
      }
      EXPECT_EQ(layer, 0) << what;
      EXPECT_EQ(next_row, dims[1]) << what;
    }
  }
}

TEST(ExchangeUnits, EachTakesAShareOfTheWorkLeftSoTheLastAreSmall) {
  // Two layers of 10 rows costing 10 each, 2 ranks: 1/4 of what is left, rounded up.
  const std::vector<ExchangeUnit> units = exchange_units({10, 10, 10}, 2, 1);
  const std::vector<std::pair<int, int>> expected = {
      {1, 5}, {1, 4}, {1, 1},                          // 200 left: 5 rows, 150: 4, the layer's last
      {0, 3}, {0, 2}, {0, 2}, {0, 1}, {0, 1}, {0, 1}};  // 100 left: 3, 70: 2, 50: 2, 30: 1, ...
  ASSERT_EQ(units.size(), expected.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(units[u].layer, expected[u].first) << "unit " << u;
    EXPECT_EQ(units[u].rows.size(), expected[u].second) << "unit " << u;
  }
  // One rank: half of what is left; more ranks: smaller units.
  EXPECT_EQ(exchange_units({10, 10, 10}, 1, 1).front().rows.size(), 10);
  EXPECT_LT(exchange_units({10, 10, 10}, 4, 1).front().rows.size(), 5);
}

TEST(ExchangeUnits, BadArgumentsAreErrorsNamingThem) {
  EXPECT_THROW(exchange_units({4}, 2, 8), ddp::Error);
  EXPECT_THROW(exchange_units({4, 2}, 2, 0), ddp::Error);
  EXPECT_THROW(exchange_units({4, 2}, 0, 8), ddp::Error);
  try {
    exchange_units({4, 0, 2}, 2, 8);
    FAIL();
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 is 4 -> 0"), std::string::npos) << e.what();
  }
}

TEST(PublishesNeeded, FollowTheBackwardChain) {
  // 4 layers: publish 1 = layer 3's output gradient, 2 = layer 2's (the chain
  // step that read layer 3's weights), 3 = layer 1's, 4 = layer 0's.
  EXPECT_EQ(publishes_needed(4, 3, false), 1);
  EXPECT_EQ(publishes_needed(4, 3, true), 2);
  EXPECT_EQ(publishes_needed(4, 2, false), 2);
  EXPECT_EQ(publishes_needed(4, 2, true), 3);
  EXPECT_EQ(publishes_needed(4, 1, false), 3);
  EXPECT_EQ(publishes_needed(4, 1, true), 4);
  EXPECT_EQ(publishes_needed(4, 0, false), 4);
  EXPECT_EQ(publishes_needed(4, 0, true), 4);  // the chain never reads layer 0's weights
  EXPECT_EQ(publishes_needed(1, 0, true), 1);
  EXPECT_THROW(publishes_needed(4, 4, false), ddp::Error);
  EXPECT_THROW(publishes_needed(4, -1, true), ddp::Error);
}

// Several threads drawing units of several micro-batches, a barrier between
// micro-batches as the trainer has: every unit once per micro-batch, none
// of the next one.
TEST(ClaimUnit, HandsOutEveryUnitOfAMicroBatchExactlyOnce) {
  constexpr int kThreads = 4, kUnits = 37, kMicroBatches = 50;
  alignas(64) std::int64_t counter = 0;
  std::vector<std::vector<std::atomic<int>>> drawn(kMicroBatches);
  for (auto& m : drawn) m = std::vector<std::atomic<int>>(kUnits);
  std::barrier between(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int m = 0; m < kMicroBatches; ++m) {
        while (const auto unit = claim_unit(&counter, std::int64_t{m} * kUnits, kUnits)) {
          drawn[m][*unit].fetch_add(1);
        }
        between.arrive_and_wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int m = 0; m < kMicroBatches; ++m) {
    for (int u = 0; u < kUnits; ++u) EXPECT_EQ(drawn[m][u].load(), 1) << "micro-batch " << m;
  }
  EXPECT_EQ(counter, std::int64_t{kMicroBatches} * kUnits);
  // A rank whose micro-batch count ran ahead of the counter is an error, not a wrong unit.
  EXPECT_THROW(claim_unit(&counter, counter + kUnits, kUnits), ddp::Error);
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

// The node's shared memory, for `world` thread-ranks of a model with layer
// sizes dims and `batch` rows per rank: the exchange blocks, their control
// words, and one gradient buffer per parameter (as ExchangeMemory lays out).
struct SharedBlocks {
  SharedBlocks(const std::vector<int>& dims, int world, int batch) {
    blocks.world = world;
    blocks.batch = batch;
    for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
      input_blocks.emplace_back(static_cast<std::size_t>(world * batch) * dims[l], NAN);
      grad_blocks.emplace_back(static_cast<std::size_t>(world * batch) * dims[l + 1], NAN);
      blocks.inputs.push_back(input_blocks.back().data());
      blocks.grads.push_back(grad_blocks.back().data());
    }
    control.assign(static_cast<std::size_t>(world + 1) * ExchangeBlocks::kStride, 0);
    blocks.published_counts = control.data();
    blocks.next_ticket = control.data() + static_cast<std::size_t>(world) * ExchangeBlocks::kStride;
  }
  // Rank r's view: the same memory, its rank, and waits for thread-ranks.
  ExchangeBlocks for_rank(int r, std::barrier<>& all) const {
    ExchangeBlocks mine = blocks;
    mine.rank = r;
    mine.wait_for_all = [&all] { all.arrive_and_wait(); };
    mine.wait_for_published = [b = blocks, waits = &waits](std::int64_t count) {
      for (int other = 0; other < b.world; ++other) {
        const auto seen = [&] {
          return std::atomic_ref<std::int64_t>(*b.published(other)).load(std::memory_order_acquire);
        };
        if (seen() < count) waits->fetch_add(1);
        while (seen() < count) std::this_thread::yield();
      }
    };
    return mine;
  }

  ExchangeBlocks blocks;
  std::vector<std::vector<float>> input_blocks, grad_blocks;
  std::vector<std::int64_t> control;
  mutable std::atomic<int> waits{0};  // times a rank found another's rows not yet published
};

class WeightRows : public ::testing::TestWithParam<int> {};

// N ranks, `batch` rows each, leave in the shared gradient buffers the
// gradient that one model computes on all N * batch rows, whichever rank
// takes which unit; a second micro-batch with accumulate adds; every unit is
// taken by exactly one rank, and updated only once every rank is done
// reading its layer's weights (the ranks share one copy of the weights, and
// the update spoils its rows: a rank that read them after would compute
// wrong output gradients for the layers below).
TEST_P(WeightRows, TheRanksLeaveTheWholeBatchGradientInTheSharedBuffers) {
  openblas_set_num_threads(1);
  const int world = GetParam(), batch = 3;
  // A wide last layer: its backward chain step takes far longer than a unit
  // of 4 rows, so an update that did not wait for it would come first.
  const std::vector<int> dims = {6, 9, 384, 512};
  const int layers = static_cast<int>(dims.size()) - 1;
  const float scale = 0.25f;
  const std::vector<float> x = inputs(world * batch, dims[0]);

  Mlp whole(dims, 7);
  const float* whole_out =
      whole.forward(x.data(), world * batch);  // before output_grad(): it sizes it
  fake_output_grad(whole_out, world * batch, dims.back(), whole.output_grad());
  Gradients expected(whole);
  whole.backward(expected, scale, false);

  SharedBlocks shared(dims, world, batch);
  std::vector<std::vector<float>> weights;  // the node's one copy of the parameters
  std::vector<float*> weight_pointers;
  for (std::size_t p = 0; p < whole.num_tensors(); ++p) {
    weights.emplace_back(whole.data(p), whole.data(p) + whole.count(p));
    weight_pointers.push_back(weights.back().data());
  }
  Gradients got(whole), once(whole);
  std::vector<float*> grads;
  for (auto& g : got.values) grads.push_back(g.data());
  const std::vector<ExchangeUnit> units = exchange_units(dims, world, 4);
  std::barrier all(world);
  std::vector<std::atomic<int>> updated(units.size());
  std::atomic<int> units_taken{0}, early_updates{0}, wrong_rows{0};
  int waits_before = 0;  // set by rank 0 between the micro-batches
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      ExchangeBlocks blocks = shared.for_rank(r, all);
      std::int64_t waited_for = 0;  // the last count this rank waited for
      blocks.wait_for_published = [&waited_for, wait = blocks.wait_for_published](std::int64_t n) {
        waited_for = n;
        wait(n);
      };
      Mlp model(dims, 7);
      model.bind(weight_pointers, false);
      model.bind_exchange(&blocks);
      const float* mine = x.data() + static_cast<std::size_t>(r) * batch * dims[0];
      for (int micro = 0; micro < 2; ++micro) {
        if (micro > 0) blocks.wait_for_all();  // before overwriting rows others may read
        // The last rank comes late to the micro-batch with updates: the
        // others already wait for its rows when it starts.
        if (micro == 1 && r == world - 1 && world > 1) {
          while (shared.waits.load() == waits_before) std::this_thread::yield();
        }
        const float* out = model.forward(mine, batch);
        fake_output_grad(out, batch, dims.back(), model.output_grad());
        model.backward_chain();
        const Mlp::UnitUpdate update = [&](const ExchangeUnit& unit, const float* weight_rows,
                                           const float* bias_rows) {
          // Accumulated: the rows handed over are those of the shared buffers.
          const std::size_t weight = 2 * static_cast<std::size_t>(unit.layer);
          const std::size_t row = static_cast<std::size_t>(unit.rows.begin);
          if (weight_rows != grads[weight] + row * static_cast<std::size_t>(dims[unit.layer]) ||
              bias_rows != grads[weight + 1] + row)
            wrong_rows++;
          // Every rank is past the chain step that read this layer's weights
          // (row_exchange.h: its publish number layers - layer + 1).
          const int past = unit.layer > 0 ? layers - unit.layer + 1 : layers;
          if (waited_for < std::int64_t{micro} * layers + past) early_updates++;
          for (int other = 0; other < world; ++other) {
            const auto seen = std::atomic_ref<std::int64_t>(*blocks.published(other)).load();
            if (seen < std::int64_t{micro} * layers + past) early_updates++;
          }
          const std::size_t width = static_cast<std::size_t>(dims[unit.layer]);
          float* w = weights[2 * static_cast<std::size_t>(unit.layer)].data();
          for (std::size_t k = unit.rows.begin * width; k < unit.rows.end * width; ++k) w[k] *= -3.0f;
          for (std::size_t u = 0; u < units.size(); ++u) {
            if (units[u].layer == unit.layer && units[u].rows.begin == unit.rows.begin)
              updated[u].fetch_add(1);
          }
        };
        units_taken += model.weight_rows(units, grads, scale, micro > 0, 
                                         micro == 1 ? update : nullptr);
        blocks.wait_for_all();  // before reading rows other ranks computed
        if (micro == 0 && r == 0) {
          once.values = got.values;  // the first micro-batch alone
          waits_before = shared.waits.load();
        }
        blocks.wait_for_all();
      }
    });
  }
  for (auto& t : ranks) t.join();

  EXPECT_EQ(units_taken.load(), 2 * static_cast<int>(units.size()));
  EXPECT_EQ(early_updates.load(), 0);
  EXPECT_EQ(wrong_rows.load(), 0);
  for (std::size_t u = 0; u < units.size(); ++u) EXPECT_EQ(updated[u].load(), 1) << "unit " << u;
  for (std::size_t p = 0; p < expected.values.size(); ++p) {
    for (std::size_t i = 0; i < expected.values[p].size(); ++i) {
      const std::string what = "param " + std::to_string(p) + " element " + std::to_string(i);
      expect_close(once.values[p][i], expected.values[p][i], what);
      expect_close(got.values[p][i], 2 * expected.values[p][i], what + " (accumulated)");
    }
  }
}

// Without accumulation the update is the gradient's only reader: the rows it
// is handed are the whole batch's gradient, from a buffer of the rank's own,
// and the shared gradient buffers are left as they were.
TEST_P(WeightRows, WithAnUpdateAndNoAccumulationTheRowsGoToTheUpdateOnly) {
  openblas_set_num_threads(1);
  const int world = GetParam(), batch = 3;
  const std::vector<int> dims = {6, 9, 70, 5};
  const float scale = 0.5f;
  const std::vector<float> x = inputs(world * batch, dims[0]);
  Mlp whole(dims, 11);
  const float* whole_out = whole.forward(x.data(), world * batch);
  fake_output_grad(whole_out, world * batch, dims.back(), whole.output_grad());
  Gradients expected(whole);
  whole.backward(expected, scale, false);

  SharedBlocks shared(dims, world, batch);
  std::vector<std::vector<float>> weights;
  std::vector<float*> weight_pointers;
  for (std::size_t p = 0; p < whole.num_tensors(); ++p) {
    weights.emplace_back(whole.data(p), whole.data(p) + whole.count(p));
    weight_pointers.push_back(weights.back().data());
  }
  constexpr float kUntouched = 12345.0f;
  Gradients buffers(whole), handed(whole);
  for (auto& g : buffers.values) std::fill(g.begin(), g.end(), kUntouched);
  std::vector<float*> grads;
  for (auto& g : buffers.values) grads.push_back(g.data());
  const std::vector<ExchangeUnit> units = exchange_units(dims, world, 4);
  std::barrier all(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      ExchangeBlocks blocks = shared.for_rank(r, all);
      Mlp model(dims, 11);
      model.bind(weight_pointers, false);
      model.bind_exchange(&blocks);
      const float* out = model.forward(x.data() + static_cast<std::size_t>(r) * batch * dims[0], batch);
      fake_output_grad(out, batch, dims.back(), model.output_grad());
      model.backward_chain();
      model.weight_rows(units, grads, scale, false,
                        [&](const ExchangeUnit& unit, const float* weight_rows, const float* bias_rows) {
                          const std::size_t w = 2 * static_cast<std::size_t>(unit.layer);
                          const std::size_t width = static_cast<std::size_t>(dims[unit.layer]);
                          const std::size_t begin = static_cast<std::size_t>(unit.rows.begin);
                          const std::size_t rows = static_cast<std::size_t>(unit.rows.size());
                          std::copy(weight_rows, weight_rows + rows * width,
                                    handed.values[w].begin() + static_cast<long>(begin * width));
                          std::copy(bias_rows, bias_rows + rows,
                                    handed.values[w + 1].begin() + static_cast<long>(begin));
                        });
      blocks.wait_for_all();
    });
  }
  for (auto& t : ranks) t.join();
  for (std::size_t p = 0; p < expected.values.size(); ++p) {
    for (std::size_t i = 0; i < expected.values[p].size(); ++i) {
      const std::string what = "param " + std::to_string(p) + " element " + std::to_string(i);
      expect_close(handed.values[p][i], expected.values[p][i], what);
      EXPECT_EQ(buffers.values[p][i], kUntouched) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, WeightRows, ::testing::Values(1, 2, 3, 5),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// The balancing itself: a rank that comes late to the units (here: only once
// the others have finished them) finds none left, and the result is the same.
TEST(WeightRows, ARankThatComesLateLeavesItsUnitsToTheOthers) {
  openblas_set_num_threads(1);
  const int world = 2, batch = 2;
  const std::vector<int> dims = {5, 8, 3};
  const std::vector<float> x = inputs(world * batch, dims[0]);
  Mlp whole(dims, 3);
  const float* whole_out = whole.forward(x.data(), world * batch);  // sizes output_grad()
  fake_output_grad(whole_out, world * batch, dims.back(), whole.output_grad());
  Gradients expected(whole), got(whole);
  whole.backward(expected, 1.0f, false);
  std::vector<float*> grads;
  for (auto& g : got.values) grads.push_back(g.data());
  SharedBlocks shared(dims, world, batch);
  const std::vector<ExchangeUnit> units = exchange_units(dims, world, 1);
  std::barrier all(world);
  std::latch first_done(1);
  int taken[world] = {};
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      ExchangeBlocks blocks = shared.for_rank(r, all);
      Mlp model(dims, 3);
      model.bind_exchange(&blocks);
      const float* out = model.forward(x.data() + static_cast<std::size_t>(r) * batch * dims[0], batch);
      fake_output_grad(out, batch, dims.back(), model.output_grad());
      model.backward_chain();
      if (r == 1) first_done.wait();
      taken[r] = model.weight_rows(units, grads, 1.0f, false);
      if (r == 0) first_done.count_down();
      blocks.wait_for_all();
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(taken[0], static_cast<int>(units.size()));
  EXPECT_EQ(taken[1], 0);
  for (std::size_t p = 0; p < expected.values.size(); ++p) {
    for (std::size_t i = 0; i < expected.values[p].size(); ++i)
      expect_close(got.values[p][i], expected.values[p][i], "param " + std::to_string(p));
  }
}

TEST(WeightRows, MisuseIsAnErrorNamingIt) {
  const std::vector<int> dims = {4, 5, 2};
  Mlp model(dims, 1);
  std::vector<float*> none;
  const std::vector<ExchangeUnit> units = exchange_units(dims, 1, 8);
  EXPECT_THROW(model.backward_chain(), ddp::Error);                              // nothing bound
  EXPECT_THROW(model.weight_rows(units, none, 1.0f, false), ddp::Error);  // nothing bound
  SharedBlocks shared(dims, 1, 2);
  std::barrier all(1);
  const ExchangeBlocks blocks = shared.for_rank(0, all);
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
  EXPECT_THROW(model.backward(sink, 1.0f, false), ddp::Error);  // the exchange is bound
  std::vector<float*> grads;
  for (auto& g : sink.values) grads.push_back(g.data());
  try {
    model.weight_rows(units, grads, 1.0f, false);  // before backward_chain()
    FAIL();
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("once after each backward_chain"), std::string::npos)
        << e.what();
  }
  model.backward_chain();
  try {
    model.backward_chain();  // the units of the last one not done
    FAIL();
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_rows() was not called"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model.weight_rows(units, none, 1.0f, false), ddp::Error);  // wrong buffer count
  EXPECT_EQ(model.weight_rows(units, grads, 1.0f, false), static_cast<int>(units.size()));
}

// bind_state moves the optimizer's state into caller-owned memory: the
// values are copied (or not), later updates use it there, and state() (what
// checkpoints save) points at it, in each parameter's groups' order.
TEST(OptimizerState, MovesIntoCallerMemoryAndUpdatesItThere) {
  Config c;
  c.optimizer = OptimizerKind::kAdam;
  c.lr = 0.1;
  const std::vector<std::size_t> counts = {3, 2};
  const auto opt = make_optimizer(c, counts);
  ASSERT_EQ(opt->state_groups(), 2u);
  std::vector<float> w0 = {1, 2, 3}, w1 = {4, 5};
  const std::vector<float> g0 = {0.5f, -1, 2}, g1 = {1, 1};
  opt->begin_step();
  opt->update(0, w0.data(), g0.data());
  opt->update(1, w1.data(), g1.data());
  const auto before = opt->param_shaped_state();
  const float m0 = static_cast<float*>(before[0][0])[2];
  EXPECT_NE(m0, 0.0f);

  std::vector<std::vector<float>> memory = {{0, 0, 0}, {0, 0}, {0, 0, 0}, {0, 0}};
  opt->bind_state({{memory[0].data(), memory[1].data()}, {memory[2].data(), memory[3].data()}});
  EXPECT_EQ(memory[0][2], m0);  // copied
  const auto state = opt->state();
  ASSERT_EQ(state.size(), 1u + 4u);  // the step count, then m0, v0, m1, v1
  EXPECT_EQ(state[1].data, memory[0].data());
  EXPECT_EQ(state[2].data, memory[2].data());
  EXPECT_EQ(state[3].data, memory[1].data());
  EXPECT_EQ(state[4].data, memory[3].data());
  const float untouched = memory[0][0];
  opt->begin_step();
  opt->update_range(0, w0.data(), g0.data(), 1, 3);
  EXPECT_NE(memory[0][2], m0);  // updated there
  EXPECT_EQ(memory[0][0], untouched);

  // Not copied: another rank fills shared memory.
  const auto fresh = make_optimizer(c, counts);
  std::vector<std::vector<float>> other = {{7, 7, 7}, {7, 7}, {7, 7, 7}, {7, 7}};
  fresh->bind_state({{other[0].data(), other[1].data()}, {other[2].data(), other[3].data()}}, false);
  EXPECT_EQ(other[0][0], 7.0f);
  EXPECT_THROW(fresh->bind_state({{other[0].data(), other[1].data()}}), ddp::Error);  // one group
  EXPECT_THROW(fresh->bind_state({{other[0].data()}, {other[2].data()}}), ddp::Error);  // one buffer
}

}  // namespace
}  // namespace train
