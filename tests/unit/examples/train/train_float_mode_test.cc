// The reference trainer's float mode (examples/train/float_mode.h): denormal
// floats are flushed to zero in the thread that asks and in the threads it
// starts afterwards, and nowhere else.

#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include "float_mode.h"

namespace train {
namespace {

// volatile: computed at run time, in the thread's float mode.
volatile float denormal = std::numeric_limits<float>::denorm_min() * 1000;
volatile float one = 1.0f, small = 1e-30f, smaller = 1e-10f;

TEST(FloatMode, DenormalsAreFlushedInTheThreadAndInThreadsItStartsAfter) {
  ASSERT_FALSE(denormals_flushed()) << "the test process already flushes denormals";
  ASSERT_NE(denormal * one, 0.0f);
  float own = 1, own_result = 1, started = 1;
  bool started_flushed = false, flushed = false;
  // Not in the test's own thread, which other tests share.
  std::thread asker([&] {
    flushed = flush_denormals();
    if (!flushed) return;          // no such mode on this CPU
    own = denormal * one;          // a denormal input counts as zero (DAZ)
    own_result = small * smaller;  // a denormal result becomes zero (FTZ)
    std::thread child([&] {
      started_flushed = denormals_flushed();
      started = denormal * one;
    });
    child.join();
  });
  asker.join();
#if defined(__x86_64__) || defined(__aarch64__)
  ASSERT_TRUE(flushed);
#endif
  if (!flushed) GTEST_SKIP() << "this CPU has no flush-to-zero mode";
  EXPECT_EQ(own, 0.0f);
  EXPECT_EQ(own_result, 0.0f);
  EXPECT_TRUE(started_flushed);
  EXPECT_EQ(started, 0.0f);
  // The test's thread keeps IEEE gradual underflow.
  EXPECT_FALSE(denormals_flushed());
  EXPECT_NE(denormal * one, 0.0f);
  EXPECT_NE(small * smaller, 0.0f);
}

}  // namespace
}  // namespace train
