// The offset allocator behind the shm backend's allocate() (internal to libddp):
// alignment, first fit, merging of freed neighbours, exhaustion, and misuse.

#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/shm/arena.h"
#include "ddp/common/error.h"
#include "error_of.h"

namespace ddp {
namespace {

// ---- ArenaAllocator: the bookkeeping behind allocate() ------------------------------------

using ::ddp::testing::error_of;
using shm::ArenaAllocator;

TEST(ArenaAllocator, OffsetsAreAlignedAndSizesRoundUp) {
  ArenaAllocator page(1 << 20);
  EXPECT_EQ(page.take(1), 0u);
  EXPECT_EQ(page.take(1), 4096u);
  EXPECT_EQ(page.take(5000), 8192u);  // two pages
  EXPECT_EQ(page.take(0), 16384u);    // 0 counts as 1
  EXPECT_EQ(page.take(4096), 20480u);
  EXPECT_EQ(page.free_bytes(), (1u << 20) - 24576u);

  ArenaAllocator lines(1000, 64);  // capacity rounds down to 960
  EXPECT_EQ(lines.free_bytes(), 960u);
  EXPECT_EQ(lines.take(1), 0u);
  EXPECT_EQ(lines.take(65), 64u);
  EXPECT_EQ(lines.take(64), 192u);
  for (std::size_t k = 0; k < 8; ++k) {
    auto at = lines.take(10);
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(*at % 64, 0u);
  }
  EXPECT_EQ(lines.free_bytes(), 960u - 12 * 64);
}

TEST(ArenaAllocator, TakesTheFirstBlockThatFitsNotTheBestOne) {
  ArenaAllocator a(16 * 4096);
  auto p0 = a.take(2 * 4096), p1 = a.take(4096), p2 = a.take(4096), p3 = a.take(4096);
  ASSERT_TRUE(p0 && p1 && p2 && p3);
  a.give_back(*p0);             // a hole of 2 pages at 0
  a.give_back(*p2);             // a hole of 1 page at 3 pages
  EXPECT_EQ(a.take(4096), 0u);  // first fit: the 2-page hole, not the exact 1-page one
  EXPECT_EQ(a.take(4096), 4096u);
  EXPECT_EQ(a.take(4096), 3u * 4096);
  EXPECT_EQ(a.take(2 * 4096), 5u * 4096);  // past the last used block
}

TEST(ArenaAllocator, FreedNeighboursMergeInAnyOrder) {
  // Each order of giving back three adjacent blocks ends in one block of everything.
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 1, 0}, {0, 2, 1},
                                                {1, 0, 2}, {1, 2, 0}, {2, 0, 1}};
  for (const auto& order : orders) {
    SCOPED_TRACE(::testing::PrintToString(order));
    ArenaAllocator a(3 * 8192);
    std::vector<std::size_t> at;
    for (int k = 0; k < 3; ++k) {
      auto p = a.take(8192);
      ASSERT_TRUE(p.has_value());
      at.push_back(*p);
    }
    EXPECT_EQ(a.take(1), std::nullopt);
    for (int k : order) a.give_back(at[k]);
    EXPECT_EQ(a.free_bytes(), 3u * 8192);
    EXPECT_EQ(a.take(3 * 8192), 0u) << "the freed blocks did not merge into one";
  }
}

TEST(ArenaAllocator, ExhaustionReturnsNothing) {
  ArenaAllocator a(4 * 4096);
  EXPECT_EQ(a.take(5 * 4096), std::nullopt);
  EXPECT_EQ(a.take(std::numeric_limits<std::size_t>::max()),
            std::nullopt);  // rounding up would overflow
  EXPECT_EQ(a.take(std::numeric_limits<std::size_t>::max() - 100), std::nullopt);
  auto all = a.take(4 * 4096);
  EXPECT_EQ(all, 0u);
  EXPECT_EQ(a.take(1), std::nullopt);
  EXPECT_EQ(a.free_bytes(), 0u);
  a.give_back(*all);
  EXPECT_EQ(a.take(4 * 4096), 0u);

  ArenaAllocator none(100);  // less than one page: no room at all
  EXPECT_EQ(none.free_bytes(), 0u);
  EXPECT_EQ(none.take(1), std::nullopt);
}

TEST(ArenaAllocator, GivingBackWhatWasNotTakenThrows) {
  ArenaAllocator a(8 * 4096);
  auto p = a.take(2 * 4096);
  ASSERT_EQ(p, 0u);
  EXPECT_THROW(a.give_back(4096), Error);      // inside a block, not its start
  EXPECT_THROW(a.give_back(2 * 4096), Error);  // free space
  EXPECT_THROW(a.give_back(1 << 30), Error);   // outside the arena
  EXPECT_NE(error_of([&] { a.give_back(12345); }).find("12345"), std::string::npos);
  a.give_back(*p);
  EXPECT_THROW(a.give_back(*p), Error);  // twice
  EXPECT_EQ(a.free_bytes(), 8u * 4096);
}

}  // namespace
}  // namespace ddp
