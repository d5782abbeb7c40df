// ddp::DistributedSampler and ddp::strided_shard: torch's arithmetic, checked as
// properties over many (dataset size, replicas) pairs and against torch itself.

#include "ddp/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "subprocess.h"
#include "torch_env.h"

namespace ddp {
namespace {

using Indices = std::vector<std::int64_t>;
using namespace std::chrono_literals;

// All ranks' indices of one configuration, each rank from its own instance
// (as separate processes would build them).
std::vector<Indices> all_ranks(std::int64_t n, int replicas, bool shuffle, bool drop_last,
                               std::uint64_t seed = 0, std::int64_t epoch = 0) {
  std::vector<Indices> result;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler sampler(n, replicas, r, shuffle, seed, drop_last);
    sampler.set_epoch(epoch);
    result.push_back(sampler.indices());
  }
  return result;
}

// index -> how many times it appears across ranks.
std::map<std::int64_t, int> occurrences(const std::vector<Indices>& ranks) {
  std::map<std::int64_t, int> count;
  for (const auto& mine : ranks) {
    for (auto i : mine) ++count[i];
  }
  return count;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

TEST(DistributedSampler, EvenSplitReadsEveryIndexExactlyOnce) {
  for (int replicas = 1; replicas <= 9; ++replicas) {
    for (std::int64_t per_rank = 0; per_rank <= 12; ++per_rank) {
      const std::int64_t n = per_rank * replicas;
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " replicas=" << replicas << " shuffle="
                                            << shuffle << " drop_last=" << drop_last);
          auto ranks = all_ranks(n, replicas, shuffle, drop_last, /*seed=*/7, /*epoch=*/3);
          for (const auto& mine : ranks)
            EXPECT_EQ(static_cast<std::int64_t>(mine.size()), per_rank);
          auto count = occurrences(ranks);
          ASSERT_EQ(static_cast<std::int64_t>(count.size()), n);
          for (const auto& [index, times] : count) {
            EXPECT_GE(index, 0);
            EXPECT_LT(index, n);
            EXPECT_EQ(times, 1) << "index " << index;
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, UnevenSplitPadsEveryRankToTheSameCountAndCoversTheDataset) {
  for (int replicas = 1; replicas <= 12; ++replicas) {
    for (std::int64_t n = 1; n <= 40; ++n) {
      for (bool shuffle : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "n=" << n << " replicas=" << replicas << " shuffle=" << shuffle);
        const std::int64_t num_samples = ceil_div(n, replicas);
        const std::int64_t total = num_samples * replicas;
        auto ranks = all_ranks(n, replicas, shuffle, /*drop_last=*/false, /*seed=*/11, /*epoch=*/1);
        for (int r = 0; r < replicas; ++r) {
          EXPECT_EQ(static_cast<std::int64_t>(ranks[r].size()), num_samples) << "rank " << r;
          EXPECT_EQ(DistributedSampler(n, replicas, r, shuffle, 11, false).size(), num_samples);
          EXPECT_EQ(DistributedSampler(n, replicas, r, shuffle, 11, false).total_size(), total);
        }
        auto count = occurrences(ranks);
        ASSERT_EQ(static_cast<std::int64_t>(count.size()), n) << "the union must cover the dataset";
        // Padding repeats the order from its start (more than once when n < replicas),
        // so every index appears total / n or total / n + 1 times.
        for (const auto& [index, times] : count) {
          EXPECT_TRUE(index >= 0 && index < n) << index;
          EXPECT_GE(times, total / n) << "index " << index;
          EXPECT_LE(times, total / n + 1) << "index " << index;
        }
      }
    }
  }
}

TEST(DistributedSampler, PaddingRepeatsTheOrderFromItsStart) {
  // n=10, 3 replicas: total 12, order 0..9 then 0, 1; rank r takes r, r+3, ...
  EXPECT_EQ(DistributedSampler(10, 3, 0, false).indices(), (Indices{0, 3, 6, 9}));
  EXPECT_EQ(DistributedSampler(10, 3, 1, false).indices(), (Indices{1, 4, 7, 0}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, false).indices(), (Indices{2, 5, 8, 1}));
  // With shuffle the repeated indices are the permutation's first ones.
  auto perm = random_permutation(10, 5 + 2);
  DistributedSampler shuffled(10, 3, 1, true, /*seed=*/5);
  shuffled.set_epoch(2);
  EXPECT_EQ(shuffled.indices(), (Indices{perm[1], perm[4], perm[7], perm[0]}));
}

TEST(DistributedSampler, DatasetSmallerThanReplicasIsRepeatedMoreThanOnce) {
  // n=3, 8 replicas: one sample each, total 8 = 0,1,2,0,1,2,0,1.
  for (int r = 0; r < 8; ++r) {
    DistributedSampler sampler(3, 8, r, false);
    EXPECT_EQ(sampler.size(), 1);
    EXPECT_EQ(sampler.indices(), (Indices{r % 3})) << "rank " << r;
  }
  // n=1: every rank reads index 0.
  for (int r = 0; r < 5; ++r) EXPECT_EQ(DistributedSampler(1, 5, r).indices(), (Indices{0}));
  // n=2, 7 replicas, shuffled: still one each, both indices used, the permutation's order.
  auto ranks = all_ranks(2, 7, true, false, 3, 4);
  auto perm = random_permutation(2, 3 + 4);
  for (int r = 0; r < 7; ++r) EXPECT_EQ(ranks[r], (Indices{perm[r % 2]})) << "rank " << r;
}

TEST(DistributedSampler, DropLastDropsTheTailAndNeverRepeats) {
  for (int replicas = 1; replicas <= 12; ++replicas) {
    for (std::int64_t n = 0; n <= 40; ++n) {
      for (bool shuffle : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "n=" << n << " replicas=" << replicas << " shuffle=" << shuffle);
        const std::int64_t num_samples = n / replicas;
        const std::int64_t total = num_samples * replicas;
        auto ranks = all_ranks(n, replicas, shuffle, /*drop_last=*/true, /*seed=*/2, /*epoch=*/5);
        for (const auto& mine : ranks)
          EXPECT_EQ(static_cast<std::int64_t>(mine.size()), num_samples);
        auto count = occurrences(ranks);
        EXPECT_EQ(static_cast<std::int64_t>(count.size()), total);
        for (const auto& [index, times] : count)
          EXPECT_EQ(times, 1) << "index " << index << " repeated";
        // What is kept is the order's first total_size entries.
        auto order = shuffle ? random_permutation(n, 2 + 5) : Indices{};
        for (std::int64_t g = 0; g < total; ++g) {
          auto expected = shuffle ? order[g] : g;
          EXPECT_EQ(count.count(expected), 1u) << "position " << g;
        }
      }
    }
  }
}

TEST(DistributedSampler, RankTakesEveryNumReplicasthPositionOfOneGlobalOrder) {
  for (int replicas : {1, 2, 3, 5, 8}) {
    for (std::int64_t n : {1, 4, 9, 17, 64, 101}) {
      auto perm = random_permutation(n, 42 + 9);
      for (int r = 0; r < replicas; ++r) {
        DistributedSampler sampler(n, replicas, r, true, /*seed=*/42);
        sampler.set_epoch(9);
        auto mine = sampler.indices();
        for (std::size_t k = 0; k < mine.size(); ++k) {
          EXPECT_EQ(mine[k], perm[(r + k * replicas) % n])
              << "n=" << n << " replicas=" << replicas << " rank=" << r;
        }
      }
    }
  }
}

TEST(DistributedSampler, SetEpochChangesTheOrder) {
  DistributedSampler sampler(100, 1, 0);
  auto first = sampler.indices();
  EXPECT_EQ(sampler.indices(), first) << "the same epoch must give the same order";
  std::set<Indices> seen{first};
  for (std::int64_t epoch = 1; epoch < 10; ++epoch) {
    sampler.set_epoch(epoch);
    EXPECT_EQ(sampler.epoch(), epoch);
    auto order = sampler.indices();
    EXPECT_TRUE(seen.insert(order).second)
        << "epoch " << epoch << " repeats an earlier epoch's order";
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, DistributedSampler(100, 1, 0, false).indices()) << "epoch " << epoch;
  }
  sampler.set_epoch(0);
  EXPECT_EQ(sampler.indices(), first);
  // Without shuffle the epoch does not matter.
  DistributedSampler plain(100, 4, 1, false);
  auto before = plain.indices();
  plain.set_epoch(3);
  EXPECT_EQ(plain.indices(), before);
}

TEST(DistributedSampler, SameSeedAndEpochGiveTheSameOrderOnEveryInstance) {
  for (int replicas : {1, 3, 4}) {
    for (int r = 0; r < replicas; ++r) {
      DistributedSampler a(257, replicas, r, true, /*seed=*/123);
      DistributedSampler b(257, replicas, r, true, /*seed=*/123);
      a.set_epoch(4);
      b.set_epoch(4);
      EXPECT_EQ(a.indices(), b.indices());
    }
  }
  // seed + epoch is what is mixed in, as in torch.
  DistributedSampler a(50, 2, 1, true, /*seed=*/10);
  DistributedSampler b(50, 2, 1, true, /*seed=*/7);
  a.set_epoch(0);
  b.set_epoch(3);
  EXPECT_EQ(a.indices(), b.indices());
  DistributedSampler c(50, 2, 1, true, /*seed=*/8);
  EXPECT_NE(a.indices(), c.indices());
}

TEST(DistributedSampler, NoShuffleOrderIsTorchsSequentialThenStrided) {
  for (int replicas = 1; replicas <= 6; ++replicas) {
    for (std::int64_t n = 0; n <= 30; ++n) {
      for (bool drop_last : {false, true}) {
        // torch: list(range(n)), padded from the start or cut, then [rank:total:replicas].
        Indices order;
        for (std::int64_t i = 0; i < n; ++i) order.push_back(i);
        std::int64_t num = drop_last ? n / replicas : ceil_div(n, replicas);
        std::int64_t total = num * replicas;
        Indices padded;
        for (std::int64_t g = 0; g < total; ++g) padded.push_back(order[g % n]);
        for (int r = 0; r < replicas; ++r) {
          Indices expected;
          for (std::int64_t g = r; g < total; g += replicas) expected.push_back(padded[g]);
          EXPECT_EQ(DistributedSampler(n, replicas, r, false, 0, drop_last).indices(), expected)
              << "n=" << n << " replicas=" << replicas << " rank=" << r
              << " drop_last=" << drop_last;
        }
      }
    }
  }
}

TEST(RandomPermutation, IsAPermutationPinnedByItsDocumentedAlgorithm) {
  for (std::int64_t n = 0; n <= 200; ++n) {
    auto p = random_permutation(n, static_cast<std::uint64_t>(n) * 31);
    std::sort(p.begin(), p.end());
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], i) << "n=" << n;
  }
  // Values from an independent Python implementation of the algorithm in
  // sampler.h: a change of generator changes every trainer's data order.
  EXPECT_EQ(random_permutation(10, 0), (Indices{6, 3, 2, 9, 8, 1, 4, 7, 0, 5}));
  EXPECT_EQ(random_permutation(10, 1), (Indices{4, 2, 8, 1, 9, 3, 0, 6, 7, 5}));
  EXPECT_EQ(random_permutation(16, 12345),
            (Indices{1, 4, 8, 9, 11, 13, 15, 7, 14, 6, 10, 3, 2, 5, 12, 0}));
}

TEST(RandomPermutation, FirstPositionIsRoughlyUniform) {
  std::map<std::int64_t, int> first;
  const int seeds = 5000;
  for (int s = 0; s < seeds; ++s) ++first[random_permutation(5, static_cast<std::uint64_t>(s))[0]];
  for (std::int64_t v = 0; v < 5; ++v) {
    EXPECT_GT(first[v], 850) << "value " << v;  // expected 1000, sd ~28
    EXPECT_LT(first[v], 1150) << "value " << v;
  }
}

void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no ddp::Error (expected one naming '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DistributedSampler, RejectsBadArgumentsNamingThem) {
  expect_error_naming([] { DistributedSampler(10, 2, 2); },
                      "rank 2 is outside [0, num_replicas=2)");
  expect_error_naming([] { DistributedSampler(10, 2, -1); }, "rank -1");
  expect_error_naming([] { DistributedSampler(10, 0, 0); }, "num_replicas must be >= 1, got 0");
  expect_error_naming([] { DistributedSampler(-5, 2, 0); }, "dataset_size must be >= 0, got -5");
  expect_error_naming([] { strided_shard(10, 3, 3); }, "strided_shard: rank 3");
  expect_error_naming([] { strided_shard(10, -1, 0); }, "num_replicas");
  expect_error_naming([] { strided_shard(-1, 1, 0); }, "dataset_size");
  expect_error_naming([] { random_permutation(-2, 0); }, "n must be >= 0");
}

TEST(DistributedSampler, EmptyDatasetGivesNothing) {
  for (bool drop_last : {false, true}) {
    DistributedSampler sampler(0, 3, 2, true, 0, drop_last);
    EXPECT_EQ(sampler.size(), 0);
    EXPECT_TRUE(sampler.indices().empty());
  }
}

TEST(StridedShard, EveryIndexOnceWithIndexModWorldEqualToRank) {
  for (int replicas = 1; replicas <= 8; ++replicas) {
    for (std::int64_t n = 0; n <= 30; ++n) {
      std::map<std::int64_t, int> count;
      for (int r = 0; r < replicas; ++r) {
        auto mine = strided_shard(n, replicas, r);
        EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
        EXPECT_EQ(static_cast<std::int64_t>(mine.size()), n / replicas + (r < n % replicas ? 1 : 0))
            << "n=" << n << " replicas=" << replicas << " rank=" << r;
        for (auto i : mine) {
          EXPECT_EQ(i % replicas, r);
          ++count[i];
        }
      }
      ASSERT_EQ(static_cast<std::int64_t>(count.size()), n);
      for (const auto& [index, times] : count) EXPECT_EQ(times, 1) << "index " << index;
    }
  }
  EXPECT_EQ(strided_shard(10, 4, 1), (Indices{1, 5, 9}));
  EXPECT_EQ(strided_shard(10, 4, 3), (Indices{3, 7}));
}

// The overloads without num_replicas/rank read the environment contract, which
// libddp parses once per process: check them in a child with RANK/WORLD_SIZE set.
TEST(DistributedSampler, DefaultsComeFromTheEnvironmentContract) {
  if (std::getenv("DDP_SAMPLER_TEST_CHILD") != nullptr) {
    DistributedSampler sampler(11, {.shuffle = false, .seed = 0, .drop_last = false});
    EXPECT_EQ(sampler.num_replicas(), 3);
    EXPECT_EQ(sampler.rank(), 2);
    EXPECT_EQ(sampler.indices(), (Indices{2, 5, 8, 0}));
    EXPECT_FALSE(sampler.shuffle());
    DistributedSampler shuffled(11);
    EXPECT_TRUE(shuffled.shuffle());
    EXPECT_EQ(shuffled.indices(), DistributedSampler(11, 3, 2).indices());
    EXPECT_EQ(strided_shard(11), (Indices{2, 5, 8}));
    return;
  }
  // This process: whatever its own environment says (a world of one outside a job).
  DistributedSampler here(7, {.shuffle = false, .seed = 0, .drop_last = false});
  EXPECT_EQ(here.num_replicas(), ddp::world_size());
  EXPECT_EQ(here.rank(), ddp::rank());

  auto r = testing::run_process(
      {std::filesystem::read_symlink("/proc/self/exe").string(),
       "--gtest_filter=DistributedSampler.DefaultsComeFromTheEnvironmentContract"},
      {{"DDP_SAMPLER_TEST_CHILD", "1"}, {"RANK", "2"}, {"WORLD_SIZE", "3"}}, 60s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
}

// --- torch itself ---------------------------------------------------------------

using testing::torch2_python;
using testing::torch2_unavailable_reason;

// Prints one line per (n, replicas, rank, shuffle, drop_last):
// "n replicas rank shuffle drop_last len : i i i ...".
const char* const kTorchScript = R"PY(
import sys
from torch.utils.data.distributed import DistributedSampler
sizes = [int(x) for x in sys.argv[1].split(",")]
replicas = [int(x) for x in sys.argv[2].split(",")]
for n in sizes:
    for R in replicas:
        for shuffle in (0, 1):
            for drop_last in (0, 1):
                for rank in range(R):
                    s = DistributedSampler(range(n), num_replicas=R, rank=rank, shuffle=bool(shuffle),
                                           seed=3, drop_last=bool(drop_last))
                    s.set_epoch(2)
                    idx = list(s)
                    print(n, R, rank, shuffle, drop_last, len(s), ":", *idx)
)PY";

TEST(DistributedSamplerVsTorch, SameIndicesWithoutShuffleAndSameCountsWithShuffle) {
  if (auto reason = torch2_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const std::vector<std::int64_t> sizes = {0, 1, 2, 3, 7, 10, 12, 13, 17, 31};
  const std::vector<int> replicas = {1, 2, 3, 4, 5, 8, 16};
  auto join = [](const auto& v) {
    std::string s;
    for (auto x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);  // (not "," + to_string: g++ 12 warns falsely, -Wrestrict)
    }
    return s;
  };
  auto r = testing::run_process({torch2_python(), "-c", kTorchScript, join(sizes), join(replicas)},
                                {}, 120s);
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.err;

  // (n, R, shuffle, drop_last) -> rank -> torch's indices.
  std::map<std::tuple<std::int64_t, int, int, int>, std::map<int, Indices>> torch;
  std::istringstream lines(r.out);
  std::string line;
  int parsed = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::int64_t n, len;
    int R, rank, shuffle, drop_last;
    std::string colon;
    ASSERT_TRUE(in >> n >> R >> rank >> shuffle >> drop_last >> len >> colon) << line;
    Indices idx;
    for (std::int64_t i; in >> i;) idx.push_back(i);
    ASSERT_EQ(static_cast<std::int64_t>(idx.size()), len) << line;
    torch[{n, R, shuffle, drop_last}][rank] = idx;
    ++parsed;
  }
  int expected_lines = 0;
  for (auto R : replicas) expected_lines += static_cast<int>(sizes.size()) * 4 * R;
  ASSERT_EQ(parsed, expected_lines) << r.out.substr(0, 2000);

  // How many indices appear k times: independent of which permutation is used.
  auto histogram = [](const std::vector<Indices>& ranks) {
    std::map<int, int> h;
    for (const auto& [index, times] : occurrences(ranks)) ++h[times];
    return h;
  };
  for (const auto& [key, by_rank] : torch) {
    const auto& [n, R, shuffle, drop_last] = key;
    SCOPED_TRACE(::testing::Message() << "n=" << n << " replicas=" << R << " shuffle=" << shuffle
                                      << " drop_last=" << drop_last);
    auto ours = all_ranks(n, R, shuffle != 0, drop_last != 0, /*seed=*/3, /*epoch=*/2);
    std::vector<Indices> theirs;
    for (int rank = 0; rank < R; ++rank) {
      theirs.push_back(by_rank.at(rank));
      ASSERT_EQ(ours[rank].size(), theirs[rank].size()) << "rank " << rank;
      EXPECT_EQ(DistributedSampler(n, R, rank, shuffle != 0, 3, drop_last != 0).size(),
                static_cast<std::int64_t>(theirs[rank].size()));
      if (!shuffle) {
        EXPECT_EQ(ours[rank], theirs[rank]) << "rank " << rank;
      }
    }
    EXPECT_EQ(histogram(ours), histogram(theirs));
  }
}

}  // namespace
}  // namespace ddp
