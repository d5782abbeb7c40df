// The pure parts of what the shm collectives share: how a descriptor reads
// in a mismatch error, where a variant can run, and how a buffer is split
// into the ranks' slices.

#include "backends/shm/context.h"

#include <gtest/gtest.h>

namespace ddp::shm {
namespace {

TEST(ShmContext, ADescriptorNamesItsCollectiveSizeDtypeOpAndRoot) {
  Context ctx;
  const Descriptor reduce =
      ctx.descriptor(Collective::kReduce, DType::kFloat32, 4096, 1,
                     static_cast<std::int32_t>(ReduceOp::kSum), Algorithm::kChunked, false);
  EXPECT_EQ(describe(reduce), "reduce of 4096 bytes of float32 (sum) from root 1");
  const Descriptor timing =
      ctx.descriptor(Collective::kAllGather, DType::kInt64, 64, -1, -1, Algorithm::kAuto, true);
  EXPECT_EQ(describe(timing), "all_gather of 64 bytes of int64 (while timing its algorithms)");
  const Descriptor barrier =
      ctx.descriptor(Collective::kBarrier, DType::kUInt8, 0, -1, -1, Algorithm::kAuto, false);
  EXPECT_EQ(describe(barrier), "barrier");
  EXPECT_EQ(describe(Descriptor{}), "an unknown collective of 0 bytes of float32")
      << "a slot nobody wrote names no collective";
}

TEST(ShmContext, ADescriptorCarriesTheRanksSettingsForTheOthersToCompare) {
  Context ctx;
  ctx.forced = Forced::unpacked(0x0201).packed();
  ctx.budget_us = 50000;
  const Descriptor d =
      ctx.descriptor(Collective::kAllReduce, DType::kFloat32, 8, -1, 0, Algorithm::kPull, false);
  EXPECT_EQ(d.forced, 0x0201u);
  EXPECT_EQ(d.budget_us, 50000u);
  EXPECT_EQ(d.algorithm, static_cast<std::uint16_t>(Algorithm::kPull));
  EXPECT_EQ(d.offset, -1) << "a buffer is private until the caller says where it is";
}

TEST(ShmContext, AVariantThatCannotRunFallsToTheOtherInPlaceOneThenToChunked) {
  EXPECT_EQ(runnable(Algorithm::kPull, true, false), Algorithm::kPull);
  EXPECT_EQ(runnable(Algorithm::kPull, false, true), Algorithm::kPush);
  EXPECT_EQ(runnable(Algorithm::kPush, false, true), Algorithm::kPush);
  EXPECT_EQ(runnable(Algorithm::kPush, true, false), Algorithm::kPull);
  EXPECT_EQ(runnable(Algorithm::kPush, false, false), Algorithm::kChunked);
  EXPECT_EQ(runnable(Algorithm::kSmall, true, true), Algorithm::kChunked);
}

TEST(ShmContext, SlicesCoverTheBufferOnceWithBoundariesOnCacheLines) {
  for (int parts : {1, 2, 3, 4, 7}) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{4099}}) {
      std::size_t next = 0;
      for (int k = 0; k < parts; ++k) {
        const Slice s = slice_of(count, parts, k, sizeof(float));
        EXPECT_EQ(s.lo, next) << parts << " parts of " << count;
        EXPECT_LE(s.lo, s.hi);
        if (s.hi < count) {
          EXPECT_EQ(s.hi * sizeof(float) % kCacheLine, 0u);
        }
        next = s.hi;
      }
      EXPECT_EQ(next, count) << parts << " parts of " << count;
    }
  }
}

}  // namespace
}  // namespace ddp::shm
