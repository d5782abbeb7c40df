// ParamShards: the layout (pure) and the gathers, with ranks as threads over
// Gloo and over shm (where the gather runs in place in shared memory).

#include "ddp/param_shards.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/heal.h"
#include "error_of.h"
#include "thread_ranks.h"

namespace ddp {
namespace {

using ::ddp::testing::error_of;
using ::ddp::testing::gloo_options;
using ::ddp::testing::on_ranks;

// Every element of every parameter is owned by exactly one rank, parameters
// are 64-byte aligned and disjoint, and the slices are equal and aligned.
void expect_partition(const ShardLayout& layout) {
  const int world = layout.world_size;
  EXPECT_EQ(layout.total_bytes % (64 * static_cast<std::size_t>(world)), 0u);
  EXPECT_EQ(layout.slice_bytes * static_cast<std::size_t>(world), layout.total_bytes);
  std::size_t end_of_previous = 0;
  for (std::size_t p = 0; p < layout.counts.size(); ++p) {
    EXPECT_EQ(layout.offsets[p] % 64, 0u) << "parameter " << p;
    EXPECT_GE(layout.offsets[p], end_of_previous)
        << "parameter " << p << " overlaps the one before";
    end_of_previous = layout.offsets[p] + layout.counts[p] * layout.element_sizes[p];
    EXPECT_LE(end_of_previous, layout.total_bytes);
    std::vector<int> owners(layout.counts[p], 0);
    for (int r = 0; r < world; ++r) {
      const ElementRange range = layout.owned(p, r);
      EXPECT_LE(range.begin, range.end);
      EXPECT_LE(range.end, layout.counts[p]);
      for (std::size_t i = range.begin; i < range.end; ++i) ++owners[i];
    }
    for (std::size_t i = 0; i < owners.size(); ++i) {
      ASSERT_EQ(owners[i], 1) << "parameter " << p << " element " << i << " of " << layout.counts[p]
                              << ", world " << world;
    }
  }
}

TEST(ShardLayout, EveryElementHasExactlyOneOwnerForRandomModelsAndWorlds) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 6);
    std::vector<std::size_t> counts, sizes;
    for (std::size_t p = 0, n = rng() % 8; p < n; ++p) {
      counts.push_back(rng() % 3 == 0 ? rng() % 5 : rng() % 5000);  // empty and tiny ones included
      sizes.push_back(std::size_t{1} << (rng() % 4));
    }
    expect_partition(make_shard_layout(counts, sizes, world));
  }
}

TEST(ShardLayout, SlicesSplitTheBufferEvenlyAndOneBigParameterIsSharedByAll) {
  const ShardLayout layout = make_shard_layout({1000, 10}, {4, 4}, 2);
  EXPECT_EQ(layout.offsets, (std::vector<std::size_t>{0, 4032}));  // 4000 bytes rounded up to 64
  EXPECT_EQ(layout.total_bytes, 4096u);
  EXPECT_EQ(layout.owned(0, 0).begin, 0u);
  EXPECT_EQ(layout.owned(0, 0).end, 512u);
  EXPECT_EQ(layout.owned(0, 1).begin, 512u);
  EXPECT_EQ(layout.owned(0, 1).end, 1000u);
  EXPECT_TRUE(layout.owned(1, 0).empty());
  EXPECT_EQ(layout.owned(1, 1).size(), 10u);
}

TEST(ShardLayout, RefusesBadElementSizesAndWorlds) {
  EXPECT_NE(
      error_of([] { make_shard_layout({4}, {3}, 2); }).find("parameter 0 has elements of 3 bytes"),
      std::string::npos);
  EXPECT_NE(error_of([] { make_shard_layout({4}, {4}, 0); }).find("world size must be >= 1, got 0"),
            std::string::npos);
}

// Each rank writes a value only it can know into its owned elements and
// garbage elsewhere; after all_gather() every rank has every owner's values.
float owner_value(std::size_t param, std::size_t i) {
  return static_cast<float>(param * 100000 + i) * 0.5f;
}

void gather_and_check(ProcessGroup& pg) {
  const std::vector<GradParam> params = {{"fc1.weight", {37, 29}},
                                         {"fc1.bias", {37}},
                                         {"empty", {0}},
                                         {"fc2.weight", {3, 3000}},
                                         {"fc2.bias", {1}}};
  ParamShards shards(pg, params);
  // One copy for the node with shm (several ranks), one per rank otherwise.
  EXPECT_EQ(shards.node_shared(), pg.backend_name() == "shm" && pg.size() > 1);
  for (std::size_t p = 0; p < params.size(); ++p) {
    float* v = shards.view(p);
    const ElementRange mine = shards.owned(p);
    for (std::size_t i = 0; i < params[p].count(); ++i) {
      if (i >= mine.begin && i < mine.end) {
        v[i] = owner_value(p, i);
      } else if (!shards.node_shared()) {
        v[i] = -1.0f - static_cast<float>(pg.rank());  // garbage the gather must overwrite
      }
    }
  }
  if (shards.node_shared()) {
    // Shared: every owner's values are everywhere after any collective, before any gather.
    pg.barrier();
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].count(); ++i) {
        ASSERT_EQ(shards.view(p)[i], owner_value(p, i))
            << params[p].name << " element " << i << " on rank " << pg.rank();
      }
    }
  }
  // Optimizer-like state in private memory, with one parameter without any.
  std::vector<std::vector<float>> state(params.size());
  std::vector<void*> state_ptrs;
  for (std::size_t p = 0; p < params.size(); ++p) {
    state[p].assign(params[p].count(), -7.0f);
    const ElementRange mine = shards.owned(p);
    for (std::size_t i = mine.begin; i < mine.end; ++i) state[p][i] = 2.0f * owner_value(p, i);
    state_ptrs.push_back(p == 1 ? nullptr : state[p].data());
  }
  for (int round = 0; round < 2; ++round) {  // twice: the gather is repeatable in the same buffer
    shards.all_gather();
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].count(); ++i) {
        ASSERT_EQ(shards.view(p)[i], owner_value(p, i))
            << params[p].name << " element " << i << " on rank " << pg.rank() << ", round "
            << round;
      }
    }
  }
  shards.all_gather(state_ptrs);
  for (std::size_t p = 0; p < params.size(); ++p) {
    for (std::size_t i = 0; i < params[p].count(); ++i) {
      const float want =
          p == 1 ? (i >= shards.owned(p).begin && i < shards.owned(p).end ? 2 * owner_value(p, i)
                                                                          : -7.0f)
                 : 2.0f * owner_value(p, i);
      ASSERT_EQ(state[p][i], want)
          << "state of " << params[p].name << " element " << i << " on rank " << pg.rank();
    }
  }
}

class ParamShardsWorlds : public ::testing::TestWithParam<int> {};

TEST_P(ParamShardsWorlds, AllGatherHandsEveryOwnersElementsToEveryRankOverGloo) {
  on_ranks(GetParam(), gather_and_check, gloo_options());
}

TEST_P(ParamShardsWorlds, AllGatherHandsEveryOwnersElementsToEveryRankInSharedMemory) {
  if (GetParam() == 1)
    GTEST_SKIP() << "shm needs two ranks or more (a world of one is covered over Gloo)";
  static std::atomic<int> runs{0};
  ProcessGroupOptions options;
  options.backend = "shm";
  options.run_id = "shards" + std::to_string(getpid()) + "x" + std::to_string(runs++);
  on_ranks(GetParam(), gather_and_check, options);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ParamShardsWorlds, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// Live recovery: with replicas each rank also keeps the slice of the rank
// half the world further on, in a buffer of its own even over shm.
TEST(ShardLayout, AReplicaIsKeptHalfTheWorldFurtherOn) {
  EXPECT_EQ(make_shard_layout({8}, {4}, 1).replica_shift(), 0);
  EXPECT_EQ(make_shard_layout({8}, {4}, 2).replica_shift(), 1);
  EXPECT_EQ(make_shard_layout({8}, {4}, 3).replica_shift(), 1);
  // Two nodes of 4 ranks: each slice's replica is on the other node.
  EXPECT_EQ(make_shard_layout({8}, {4}, 8).replica_shift(), 4);
}

TEST(ParamShards, WithReplicasEachRankKeepsAnotherRanksSliceInABufferOfItsOwn) {
  static std::atomic<int> runs{0};
  ProcessGroupOptions options;
  options.backend = "shm";
  options.run_id = "replicas" + std::to_string(getpid()) + "x" + std::to_string(runs++);
  on_ranks(
      3,
      [](ProcessGroup& pg) {
        const std::vector<GradParam> params = {{"w", {1000}}, {"b", {7}}};
        ParamShards shards(pg, params, ShardOptions{.replicas = true});
        EXPECT_FALSE(shards.node_shared());
        for (std::size_t p = 0; p < params.size(); ++p) {
          const ElementRange want =
              shards.layout().owned(p, (pg.rank() + shards.layout().replica_shift()) % 3);
          EXPECT_EQ(shards.replica(p).begin, want.begin) << "parameter " << p;
          EXPECT_EQ(shards.replica(p).end, want.end) << "parameter " << p;
        }
        ParamShards plain(pg, params);
        EXPECT_TRUE(plain.replica(0).empty());
      },
      options);
}

// The true value of element i of parameter p in buffer set k.
float true_value(std::size_t k, std::size_t p, std::size_t i) {
  return static_cast<float>(k * 1000000 + p * 10000 + i) + 0.25f;
}

// Members restore a state cut for `old_world` ranks: member m held the
// slices of old rank held_as[m] and the one it kept a replica of, with true
// values there and garbage elsewhere; afterwards everyone holds the truth.
void restore_and_check(ProcessGroup& pg, int old_world, const std::vector<int>& held_as) {
  const std::vector<std::size_t> counts = {37 * 29, 37, 0, 3000, 1};
  const ShardLayout old = make_shard_layout(counts, std::vector<std::size_t>(5, 4), old_world);
  std::vector<std::vector<std::vector<float>>> sets(2);  // the weights and one optimizer state
  std::vector<std::vector<void*>> pointers(2);
  const int was = held_as[static_cast<std::size_t>(pg.rank())];
  for (std::size_t k = 0; k < sets.size(); ++k) {
    for (std::size_t p = 0; p < counts.size(); ++p) {
      std::vector<float>& v =
          sets[k].emplace_back(counts[p], -1.0f - static_cast<float>(pg.rank()));
      for (int slice : {was, (was + old.replica_shift()) % old_world}) {
        if (was < 0) break;
        const ElementRange r = old.owned(p, slice);
        for (std::size_t i = r.begin; i < r.end; ++i) v[i] = true_value(k, p, i);
      }
      pointers[k].push_back(k == 1 && p == 1 ? nullptr : v.data());
    }
  }
  const std::uint64_t sent = ParamShards::restore(pg, old, held_as, pointers);
  EXPECT_EQ(sent, pg.size() == 1 ? 0u : old.total_bytes * sets.size());
  for (std::size_t k = 0; k < sets.size(); ++k) {
    for (std::size_t p = 0; p < counts.size(); ++p) {
      if (pointers[k][p] == nullptr) continue;
      for (std::size_t i = 0; i < counts[p]; ++i) {
        ASSERT_EQ(sets[k][p][i], true_value(k, p, i))
            << "set " << k << " parameter " << p << " element " << i << " on member " << pg.rank();
      }
    }
  }
}

TEST(ParamShards, RestoreTakesEachSliceFromItsOwnerOrTheKeeperOfItsReplica) {
  // Old ranks 2 and 3 of 4 left (old ranks 0 and 1 keep their replicas); a
  // relaunch holds nothing.
  on_ranks(3, [](ProcessGroup& pg) { restore_and_check(pg, 4, {0, 1, -1}); });
  // Old ranks 0 and 3 left: their slices come from old ranks 2 and 1.
  on_ranks(3, [](ProcessGroup& pg) { restore_and_check(pg, 4, {2, -1, 1}); });
  // One member holding everything (a layout of one slice).
  on_ranks(2, [](ProcessGroup& pg) { restore_and_check(pg, 1, {-1, 0}); });
  on_ranks(1, [](ProcessGroup& pg) { restore_and_check(pg, 1, {0}); });
}

TEST(ParamShards, RestoreThrowsAHealErrorNamingASliceNoMemberHolds) {
  on_ranks(2, [](ProcessGroup& pg) {
    const ShardLayout old = make_shard_layout({4000}, {4}, 4);
    std::vector<float> w(4000);
    // Old ranks 1 and 3 left: old rank 1's slice and its replica are gone.
    try {
      ParamShards::restore(pg, old, {0, 2}, {{w.data()}});
      ADD_FAILURE() << "restore went on without old rank 1's slice";
    } catch (const HealError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "the sharded state of old rank 1 of 4 is held by no live member (it and old "
                    "rank 3, which kept its replica, both left)"),
                std::string::npos)
          << e.what();
    }
    EXPECT_NE(error_of([&] {
                ParamShards::restore(pg, old, {0}, {{w.data()}});
              }).find("held_as has 1 entries for a group of 2"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                ParamShards::restore(pg, old, {0, 1}, {{w.data(), w.data()}});
              }).find("a set of 2 buffers for 1 parameters"),
              std::string::npos);
  });
}

TEST(ParamShards, ViewRefusesOtherDtypesAndIndicesOutOfRange) {
  on_ranks(1, [](ProcessGroup& pg) {
    ParamShards shards(pg, {{"w", {4}, DType::kFloat64}});
    EXPECT_NE(error_of([&] { shards.view(0); }).find("parameter 0 is float64, not float32"),
              std::string::npos);
    EXPECT_NE(
        error_of([&] { shards.data(1); }).find("parameter index 1 out of range (1 parameters)"),
        std::string::npos);
    EXPECT_NE(error_of([&] {
                shards.all_gather(std::vector<void*>{});
              }).find("0 buffers for 1 parameters"),
              std::string::npos);
  });
}

TEST(ParamShards, RefusesParametersInDeviceMemory) {
  on_ranks(1, [](ProcessGroup& pg) {
    GradParam p{"w", {4}};
    p.device = 0;
    EXPECT_NE(error_of([&] {
                ParamShards(pg, {p});
              }).find("parameter 'w' is on CUDA device 0 (host memory only)"),
              std::string::npos);
  });
}

}  // namespace
}  // namespace ddp
