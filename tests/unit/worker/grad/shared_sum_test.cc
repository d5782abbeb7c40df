// The shared sum: its pure layout (shared_sum.h), and SharedGradSum
// over shm groups whose ranks are threads of this process (the node-shared
// memory is the same for threads as for processes: one mapping of the
// segment per rank).

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/grad_sync.h"
#include "ddp/shared_grad_sum.h"
#include "error_of.h"
#include "grad/shared_sum.h"
#include "reference_mlp.h"
#include "thread_ranks.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ::ddp::testing::backward_order;
using ::ddp::testing::Batch;
using ::ddp::testing::error_of;
using ::ddp::testing::make_batch;
using ::ddp::testing::Mlp;
using ::ddp::testing::mlp_grads;
using ::ddp::testing::mlp_params;
using ::ddp::testing::on_ranks;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// shm for two ranks or more (a fresh run id each time); a world of one needs
// no shared memory and runs on the local backend.
ProcessGroupOptions options_for(int world, std::chrono::milliseconds timeout = 20s) {
  if (world == 1) return ::ddp::testing::gloo_options(timeout);
  static std::atomic<int> runs{0};
  ProcessGroupOptions options;
  options.backend = "shm";
  options.run_id = "sharedsum" + std::to_string(getpid()) + "x" + std::to_string(runs++);
  options.timeout = timeout;
  return options;
}

GradSyncOptions shared_options(std::size_t block_bytes = 16) {
  GradSyncOptions options;
  options.comm_mode = CommMode::kShared;
  options.shared_block_bytes = block_bytes;  // small: several blocks per parameter
  options.log_every = 0;
  return options;
}

// ------------------------------------------------------------ the layout (pure)

TEST(SharedSumLayout, BlocksCoverEveryRowOnceAndParametersStartOnCacheLines) {
  using detail::SumParam;
  // 10 x 6 float32 (240 B), a frozen one, 7 doubles (one row each), a scalar.
  const std::vector<SumParam> params = {
      {60, 4, 10, true}, {5, 4, 5, false}, {7, 8, 7, true}, {1, 4, 1, true}};
  const auto layout = detail::make_sum_layout(params, 2, 48);
  ASSERT_EQ(layout.blocks_of.size(), 4u);
  // 240 / 48 = 5 blocks, capped at 2 x world = 4; 56 / 48 = 1; the scalar 1.
  EXPECT_EQ(layout.blocks_of[0].size(), 4u);
  EXPECT_TRUE(layout.blocks_of[1].empty());
  EXPECT_EQ(layout.blocks_of[2].size(), 1u);
  EXPECT_EQ(layout.blocks_of[3].size(), 1u);
  EXPECT_EQ(layout.param_offset[0], 0u);
  EXPECT_EQ(layout.param_offset[2], 256u);  // 240 rounded up to 64
  EXPECT_EQ(layout.param_offset[3], 320u);  // 256 + 56 rounded up
  EXPECT_EQ(layout.buffer_bytes, 384u);
  EXPECT_EQ(layout.row_bytes[0], 24u);
  for (std::size_t p : {0u, 2u, 3u}) {
    std::int64_t next = 0;
    for (std::size_t id : layout.blocks_of[p]) {
      const auto& b = layout.blocks[id];
      EXPECT_EQ(b.param, p);
      EXPECT_EQ(b.row_begin, next) << "parameter " << p;
      EXPECT_GT(b.rows, 0);
      EXPECT_EQ(b.offset, layout.param_offset[p] + b.row_begin * layout.row_bytes[p]);
      next = b.row_begin + b.rows;
    }
    EXPECT_EQ(next, params[p].rows) << "parameter " << p;
  }
  // Never more blocks than rows; a large minimum gives one block.
  EXPECT_EQ(detail::make_sum_layout({{3, 4, 3, true}}, 8, 1).blocks.size(), 3u);
  EXPECT_EQ(detail::make_sum_layout({{60, 4, 10, true}}, 2, 1 << 20).blocks.size(), 1u);
  EXPECT_EQ(detail::SharedSum::bytes_needed(layout, 2),
            2 * 384u + layout.blocks.size() * 64 + 2 * 64 + 64);
}

TEST(SharedSumLayout, BadInputsAreRefused) {
  EXPECT_THROW(detail::make_sum_layout({{6, 4, 4, true}}, 2, 16), Error);  // 6 is not 4 rows
  EXPECT_THROW(detail::make_sum_layout({{4, 4, 4, true}}, 0, 16), Error);
  EXPECT_THROW(detail::make_sum_layout({{4, 4, 4, true}}, 2, 0), Error);
}

// ------------------------------------------------------------ SharedGradSum: the mean

// Hands gradient g (registration-order elements) over block by block, as a
// GEMM with beta would: store or add scale * g. Counts the stores per block.
void contribute_blocks(SharedGradSum& sync, std::size_t p, const std::vector<double>& g,
                       std::map<std::pair<std::size_t, std::int64_t>, int>* stores,
                       std::mutex* mu) {
  sync.contribute(p, [&](const GradBlock& b) {
    float* out = static_cast<float*>(b.data);
    const std::size_t first = static_cast<std::size_t>(b.row_begin) * b.row_elements;
    for (std::size_t i = 0; i < static_cast<std::size_t>(b.rows) * b.row_elements; ++i) {
      const float v = b.scale * static_cast<float>(g[first + i]);
      out[i] = b.accumulate ? out[i] + v : v;
    }
    if (!b.accumulate && stores) {
      std::lock_guard<std::mutex> lock(*mu);
      ++(*stores)[{p, b.row_begin}];
    }
  });
}

class SharedEquivalence : public ::testing::TestWithParam<int> {};

// Iterations alternate the hand-over paths (blocks, add_grad, set_grad);
// every rank ends with the whole batch's gradient, the same bytes at the
// same place, and each block was stored (not added to) exactly once per window.
TEST_P(SharedEquivalence, ShardedMeanGradientEqualsWholeBatchGradient) {
  const int world = GetParam();
  const int kBatch = 24, kIterations = 5;
  const Mlp model = testing::make_mlp({7, 13, 11, 5}, 7);
  std::mutex mu;
  std::vector<std::map<std::pair<std::size_t, std::int64_t>, int>> stores(kIterations);
  std::vector<std::vector<std::vector<float>>> results(
      world, std::vector<std::vector<float>>(kIterations));
  std::vector<std::vector<const void*>> where(world);
  on_ranks(
      world,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, mlp_params(model), shared_options());
        EXPECT_EQ(sync.comm_mode(), CommMode::kShared);
        // Zeros before the first window's result.
        EXPECT_EQ(sync.grad_view(0)[0], 0.0f);
        const int shard = kBatch / world;
        for (int it = 0; it < kIterations; ++it) {
          const Batch batch = make_batch(model, kBatch, 100 + it);
          auto mine = mlp_grads(model, batch, pg.rank() * shard, (pg.rank() + 1) * shard);
          sync.begin_backward();
          for (std::size_t p : backward_order(model)) {
            const std::vector<float> f(mine[p].begin(), mine[p].end());
            switch ((it + p) % 3) {
              case 0:
                contribute_blocks(sync, p, mine[p], &stores[it], &mu);
                break;
              case 1:
                sync.add_grad(p, f.data());
                break;
              default:
                sync.set_grad(p, f.data());
                break;
            }
          }
          sync.finish();
          const auto want = mlp_grads(model, batch, 0, kBatch);
          std::vector<float> all;
          for (std::size_t p = 0; p < want.size(); ++p) {
            const float* got = sync.grad_view(p);
            for (std::size_t i = 0; i < want[p].size(); ++i) {
              ASSERT_NEAR(got[i], want[p][i], 1e-6 + 1e-5 * std::abs(want[p][i]))
                  << "rank " << pg.rank() << " iteration " << it + 1 << " " << sync.param(p).name
                  << "[" << i << "]";
            }
            all.insert(all.end(), got, got + want[p].size());
          }
          results[pg.rank()][it] = all;
          where[pg.rank()].push_back(sync.grad(0));
          const IterationStats last = sync.stats().last;
          EXPECT_TRUE(last.synced);
          EXPECT_EQ(last.buckets, 0u);
          EXPECT_EQ(last.bytes_on_wire, 0u);
          EXPECT_EQ(last.overlap_ms, 0.0);
          EXPECT_EQ(last.comm_ms, last.exposed_comm_ms);
          EXPECT_GE(last.exposed_comm_ms, 0.0);
        }
      },
      options_for(world));
  for (int it = 0; it < kIterations; ++it) {
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(results[r][it], results[0][it]) << "rank " << r << " iteration " << it + 1;
    }
    for (const auto& [block, count] : stores[it]) {
      EXPECT_EQ(count, 1) << "iteration " << it + 1 << ": parameter " << block.first
                          << " rows from " << block.second << " were stored " << count
                          << " times (expected once, then added to)";
    }
  }
  // Two buffers alternate: consecutive windows' results are in different places.
  for (int it = 1; it < kIterations; ++it) EXPECT_NE(where[0][it], where[0][it - 1]);
  EXPECT_EQ(where[0][2], where[0][0]);
}

INSTANTIATE_TEST_SUITE_P(Worlds, SharedEquivalence, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Ranks hand parameters over in different random orders, from two threads
// each, with random pauses: every rank still ends with the same mean.
TEST(SharedSum, RandomOrdersAndThreadsPerRankGiveTheSameMean) {
  const int kWorld = 3, kIterations = 6, kBatch = 24;
  const Mlp model = testing::make_mlp({7, 13, 11, 5}, 11);
  on_ranks(
      kWorld,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, mlp_params(model), shared_options(8));
        std::mt19937 gen(77u + static_cast<unsigned>(pg.rank()));
        const int shard = kBatch / kWorld;
        for (int it = 0; it < kIterations; ++it) {
          const Batch batch = make_batch(model, kBatch, 300 + it);
          auto mine = mlp_grads(model, batch, pg.rank() * shard, (pg.rank() + 1) * shard);
          std::vector<std::size_t> order(mine.size());
          std::iota(order.begin(), order.end(), 0);
          std::shuffle(order.begin(), order.end(), gen);
          std::vector<unsigned> pauses;
          for (std::size_t k = 0; k < order.size(); ++k) pauses.push_back(gen() % 200);
          auto hand_over = [&](std::size_t from) {
            for (std::size_t k = from; k < order.size(); k += 2) {
              contribute_blocks(sync, order[k], mine[order[k]], nullptr, nullptr);
              std::this_thread::sleep_for(std::chrono::microseconds(pauses[k]));
            }
          };
          std::thread other(hand_over, 1);
          hand_over(0);
          other.join();
          sync.finish();
          const auto want = mlp_grads(model, batch, 0, kBatch);
          for (std::size_t p = 0; p < want.size(); ++p) {
            for (std::size_t i = 0; i < want[p].size(); ++i) {
              ASSERT_NEAR(sync.grad_view(p)[i], want[p][i], 1e-6 + 1e-5 * std::abs(want[p][i]))
                  << "rank " << pg.rank() << " iteration " << it + 1;
            }
          }
        }
      },
      options_for(kWorld));
}

// no_sync iterations add into the same sum; the synced one ends the window.
TEST(SharedSum, NoSyncMicroBatchesAddUpAndTheNextWindowStartsFromZero) {
  const int kWorld = 2, kMicro = 3;
  auto value = [](int rank, int window, int micro, std::size_t i) {
    return static_cast<float>(rank + 1) * 0.5f + static_cast<float>(micro) +
           static_cast<float>(window) * 10 + static_cast<float>(i) / 4;
  };
  on_ranks(
      kWorld,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, {{"w", {6, 2}}, {"b", {3}}}, shared_options(8));
        for (int window = 0; window < 2; ++window) {
          for (int micro = 0; micro < kMicro; ++micro) {
            auto step = [&] {
              for (std::size_t p = 0; p < 2; ++p) {
                std::vector<float> g(sync.param(p).count());
                for (std::size_t i = 0; i < g.size(); ++i)
                  g[i] = value(pg.rank(), window, micro, i);
                sync.add_grad(p, g.data());
              }
              sync.finish();
            };
            if (micro + 1 < kMicro) {
              auto guard = sync.no_sync();
              step();
              EXPECT_FALSE(sync.stats().last.synced);
            } else {
              step();
              EXPECT_TRUE(sync.stats().last.synced);
            }
          }
          for (std::size_t p = 0; p < 2; ++p) {
            for (std::size_t i = 0; i < sync.param(p).count(); ++i) {
              double want = 0;
              for (int r = 0; r < kWorld; ++r)
                for (int m = 0; m < kMicro; ++m) want += value(r, window, m, i);
              ASSERT_NEAR(sync.grad_view(p)[i], want / kWorld, 1e-4)
                  << "rank " << pg.rank() << " window " << window << " " << sync.param(p).name
                  << "[" << i << "]";
            }
          }
        }
      },
      options_for(kWorld));
}

// Every floating dtype is summed in its own precision.
TEST(SharedSum, EveryFloatingDtypeIsAveraged) {
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg,
                           {{"f32", {4}, DType::kFloat32},
                            {"f64", {4}, DType::kFloat64},
                            {"f16", {4}, DType::kFloat16},
                            {"bf16", {4}, DType::kBFloat16}},
                           shared_options());
        const float v = pg.rank() == 0 ? 1.0f : 3.0f;
        const std::vector<float> f(4, v);
        const std::vector<double> d(4, v);
        const std::uint16_t h = pg.rank() == 0 ? 0x3c00 : 0x4200;   // 1, 3 in half
        const std::uint16_t bf = pg.rank() == 0 ? 0x3f80 : 0x4040;  // 1, 3 in bfloat16
        const std::vector<std::uint16_t> hs(4, h), bfs(4, bf);
        sync.add_grad(0, f.data());
        sync.add_grad(1, d.data());
        sync.add_grad(2, hs.data());
        sync.add_grad(3, bfs.data());
        sync.finish();
        EXPECT_EQ(static_cast<float*>(sync.grad(0))[3], 2.0f);
        EXPECT_EQ(static_cast<double*>(sync.grad(1))[3], 2.0);
        EXPECT_EQ(static_cast<std::uint16_t*>(sync.grad(2))[3], 0x4000);  // 2 in half
        EXPECT_EQ(static_cast<std::uint16_t*>(sync.grad(3))[3], 0x4000);  // 2 in bfloat16
      },
      options_for(2));
}

// ------------------------------------------------------------ missing and failed gradients

TEST(SharedSum, AParameterNotHandedOverFailsEveryRankAndTheOwnerNamesIt) {
  std::vector<std::string> errors(2);
  std::vector<float> after(2);
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, {{"fc1.weight", {4}}, {"fc2.bias", {4}}}, shared_options());
        const std::vector<float> g(4, 1.0f);
        sync.add_grad(0, g.data());
        if (pg.rank() == 0) sync.add_grad(1, g.data());
        errors[pg.rank()] = error_of([&] { sync.finish(); });
        // The next iteration is whole again.
        sync.add_grad(0, g.data());
        sync.add_grad(1, g.data());
        EXPECT_NO_THROW(sync.finish());
        after[pg.rank()] = sync.grad_view(1)[0];
      },
      options_for(2));
  EXPECT_TRUE(has(errors[1], "never handed over on rank 1")) << errors[1];
  EXPECT_TRUE(has(errors[1], "'fc2.bias'")) << errors[1];
  EXPECT_TRUE(has(errors[0], "'fc2.bias'")) << errors[0];
  EXPECT_TRUE(has(errors[0], "no valid gradient from some rank")) << errors[0];
  EXPECT_EQ(after[0], 1.0f);
  EXPECT_EQ(after[1], 1.0f);
}

TEST(SharedSum, FindUnusedParametersCountsThemAsZero) {
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        GradSyncOptions options = shared_options();
        options.find_unused_parameters = true;
        SharedGradSum sync(pg, {{"used", {4}}, {"sometimes", {4}}, {"never", {4}}}, options);
        for (int it = 0; it < 3; ++it) {
          const std::vector<float> g(4, 2.0f);
          sync.add_grad(0, g.data());
          if (pg.rank() == 1) sync.add_grad(1, g.data());  // rank 0 never has it
          ASSERT_NO_THROW(sync.finish());
          EXPECT_EQ(sync.grad_view(0)[2], 2.0f);
          EXPECT_EQ(sync.grad_view(1)[2], 1.0f);  // (0 + 2) / 2
          EXPECT_EQ(sync.grad_view(2)[2], 0.0f);
        }
      },
      options_for(2));
}

TEST(SharedSum, AWriterThatThrowsLosesTheIterationOnEveryRankWithoutAHang) {
  std::vector<std::string> contribute_errors(2), finish_errors(2);
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, {{"w", {8, 2}}, {"b", {2}}}, shared_options(8));
        const std::vector<float> g(16, 1.0f);
        contribute_errors[pg.rank()] = error_of([&] {
          sync.contribute(0, [&](const GradBlock& b) {
            if (pg.rank() == 1 && b.row_begin > 0) throw Error("the writer failed on purpose");
            float* out = static_cast<float*>(b.data);
            for (std::size_t i = 0; i < b.rows * b.row_elements; ++i)
              out[i] = b.accumulate ? out[i] + b.scale : b.scale;
          });
        });
        sync.add_grad(1, g.data());
        finish_errors[pg.rank()] = error_of([&] { sync.finish(); });
        // Not sticky: the next iteration works.
        sync.add_grad(0, g.data());
        sync.add_grad(1, g.data());
        EXPECT_NO_THROW(sync.finish());
        EXPECT_EQ(sync.grad_view(0)[15], 1.0f);
      },
      options_for(2));
  EXPECT_EQ(contribute_errors[0], "(no error)");
  EXPECT_TRUE(has(contribute_errors[1], "the writer failed on purpose")) << contribute_errors[1];
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(has(finish_errors[r], "'w' (index 0)")) << "rank " << r << ": " << finish_errors[r];
    EXPECT_TRUE(has(finish_errors[r], "invalid")) << "rank " << r << ": " << finish_errors[r];
  }
}

// ------------------------------------------------------------ timeouts name the rank

TEST(SharedSum, ARankThatNeverFinishesIsNamedWithinTheTimeout) {
  std::string error, later;
  double seconds = 0;
  std::atomic<bool> released{false};
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, {{"w", {4}}}, shared_options());
        const std::vector<float> g(4, 1.0f);
        if (pg.rank() == 1) {
          // Stalls (never hands over nor finishes) until rank 0 has given up.
          while (!released.load()) std::this_thread::sleep_for(1ms);
          return;
        }
        sync.add_grad(0, g.data());
        const auto start = std::chrono::steady_clock::now();
        error = error_of([&] { sync.finish(); });
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        later = error_of([&] { sync.add_grad(0, g.data()); });
        released = true;
      },
      options_for(2, 700ms));
  EXPECT_TRUE(has(error, "rank 1 (finished 0) did not finish adding its gradients of iteration 1"))
      << error;
  EXPECT_TRUE(has(error, "timeout of 700 ms")) << error;
  EXPECT_GE(seconds, 0.6);
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(has(later, "did not finish adding")) << "later calls repeat the failure: " << later;
}

TEST(SharedSum, ABlockHeldPastTheTimeoutNamesItsHolder) {
  std::string error;
  std::atomic<bool> holding{false}, released{false};
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        // One block per parameter: the second rank can only wait for it.
        SharedGradSum sync(pg, {{"fc1.weight", {4}}}, shared_options(1 << 20));
        if (pg.rank() == 1) {
          std::thread([&] {
            while (!holding.load()) std::this_thread::sleep_for(1ms);
            error = error_of([&] { sync.contribute(0, [](const GradBlock&) {}); });
            released = true;
          }).join();
          return;
        }
        sync.contribute(0, [&](const GradBlock&) {
          holding = true;
          while (!released.load()) std::this_thread::sleep_for(1ms);
        });
      },
      options_for(2, 500ms));
  EXPECT_TRUE(has(error, "rank 0 held rows [0, 4) of parameter 'fc1.weight' (index 0)")) << error;
  EXPECT_TRUE(has(error, "timeout of 500 ms")) << error;
}

// ------------------------------------------------------------ misuse

TEST(SharedSum, MisuseAndImpossibleSetupsAreRefusedWithTheirReason) {
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        SharedGradSum sync(pg, {{"w", {4}}, {"frozen", {4}, DType::kFloat32, -1, false}},
                           shared_options());
        EXPECT_TRUE(has(error_of([&] { sync.contribute(1, [](const GradBlock&) {}); }), "frozen"));
        EXPECT_TRUE(
            has(error_of([&] { sync.contribute(2, [](const GradBlock&) {}); }), "out of range"));
        sync.contribute(0, [](const GradBlock& b) {
          if (!b.accumulate) std::memset(b.data, 0, b.rows * b.row_elements * sizeof(float));
        });
        EXPECT_TRUE(has(error_of([&] { sync.contribute(0, [](const GradBlock&) {}); }),
                        "already handed over in iteration 1"));
        sync.finish();
      },
      options_for(2));
  // Over Gloo there is no node-shared memory: every rank is told why.
  std::vector<std::string> errors(2);
  on_ranks(2, [&](ProcessGroup& pg) {
    errors[pg.rank()] = error_of([&] { SharedGradSum sync(pg, {{"w", {4}}}, shared_options()); });
  });
  for (const auto& e : errors) EXPECT_TRUE(has(e, "backend gloo")) << e;
  // Every rank must build the shared sum (a rank building a GradSync is
  // named); compression is refused; a GradSync is not a shared sum.
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        GradSyncOptions options = shared_options();
        options.comm_mode = CommMode::kOverlap;
        EXPECT_TRUE(has(error_of([&] {
                          if (pg.rank() == 1) {
                            GradSync sync(pg, {{"w", {4}}}, options);
                          } else {
                            SharedGradSum sync(pg, {{"w", {4}}}, options);
                          }
                        }),
                        "comm_mode=overlap or inline"));
        options = shared_options();
        options.compression = Compression::kFp16;
        EXPECT_TRUE(has(error_of([&] {
                          SharedGradSum sync(pg, {{"w", {4}}}, options);
                        }),
                        "does not apply to comm_mode shared"));
        EXPECT_TRUE(has(error_of([&] {
                          GradSync sync(pg, {{"w", {4}}}, shared_options());
                        }),
                        "ddp::SharedGradSum"));
        // make_grad_averager picks the class from comm_mode.
        EXPECT_NE(dynamic_cast<SharedGradSum*>(
                      make_grad_averager(pg, {{"w", {4}}}, shared_options()).get()),
                  nullptr);
        GradSyncOptions overlap;
        overlap.log_every = 0;
        EXPECT_NE(dynamic_cast<GradSync*>(make_grad_averager(pg, {{"w", {4}}}, overlap).get()),
                  nullptr);
      },
      options_for(2));
}

}  // namespace
}  // namespace ddp
