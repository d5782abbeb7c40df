// ddprun --bind_cores_to_rank's split of its CPUs among the local ranks.

#include "worker_group/cpu_binding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

using Slices = std::vector<std::vector<int>>;

TEST(CpuSlices, EnoughCpusGiveEachRankItsOwnContiguousSliceTheFirstRanksTakingTheRemainder) {
  EXPECT_EQ(cpu_slices({0, 1}, 2), (Slices{{0}, {1}}));
  EXPECT_EQ(cpu_slices({0, 1, 2, 3, 4, 5, 6, 7}, 4), (Slices{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(cpu_slices({0, 1, 2, 3, 4, 5, 6}, 3), (Slices{{0, 1, 2}, {3, 4}, {5, 6}}));
  EXPECT_EQ(cpu_slices({2, 3, 8, 9, 10}, 1), (Slices{{2, 3, 8, 9, 10}}));
  // The mask's own ids (taskset -c 4,6,9), not 0..n-1.
  EXPECT_EQ(cpu_slices({4, 6, 9}, 3), (Slices{{4}, {6}, {9}}));
}

TEST(CpuSlices, EveryAllowedCpuIsUsedOnceWhateverTheCounts) {
  for (int cpus = 1; cpus <= 12; ++cpus) {
    std::vector<int> allowed;
    for (int c = 0; c < cpus; ++c) allowed.push_back(3 * c + 1);
    for (int ranks = 1; ranks <= cpus; ++ranks) {
      const Slices slices = cpu_slices(allowed, ranks);
      ASSERT_EQ(slices.size(), static_cast<std::size_t>(ranks));
      std::vector<int> seen;
      std::size_t smallest = allowed.size(), largest = 0;
      for (const auto& slice : slices) {
        seen.insert(seen.end(), slice.begin(), slice.end());
        smallest = std::min(smallest, slice.size());
        largest = std::max(largest, slice.size());
      }
      EXPECT_EQ(seen, allowed) << cpus << " CPUs, " << ranks << " ranks";
      EXPECT_LE(largest - smallest, 1u) << cpus << " CPUs, " << ranks << " ranks";
    }
  }
}

TEST(CpuSlices, MoreRanksThanCpusGoRoundRobinOneCpuEach) {
  EXPECT_EQ(cpu_slices({0, 1}, 4), (Slices{{0}, {1}, {0}, {1}}));
  EXPECT_EQ(cpu_slices({5}, 3), (Slices{{5}, {5}, {5}}));
  const Slices slices = cpu_slices({0, 1, 2}, 8);
  std::map<int, int> load;
  for (const auto& slice : slices) {
    ASSERT_EQ(slice.size(), 1u);
    ++load[slice[0]];
  }
  EXPECT_EQ(load, (std::map<int, int>{{0, 3}, {1, 3}, {2, 2}}));
}

TEST(CpuSlices, NoCpuOrNoRankIsAnErrorNamingTheFlag) {
  for (auto call : {+[] { cpu_slices({}, 2); }, +[] { cpu_slices({0, 1}, 0); }}) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--bind_cores_to_rank"), std::string::npos) << e.what();
    }
  }
}

TEST(AllowedCpus, AreThisProcesssMaskInAscendingOrder) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::set<int>(cpus.begin(), cpus.end()).size() == cpus.size());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
}

}  // namespace
}  // namespace ddp::launcher
