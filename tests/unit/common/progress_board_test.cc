// The progress board's step slots: the window of step times and its
// percentiles, a step recorded in a slot, and a board with step slots
// attached by a worker next to one made by an older ddprun (none).

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "ddp/common/progress_board.h"

namespace ddp {
namespace {

TEST(StepWindow, MedianAndP99AreNearestRanksOfTheLastSteps) {
  StepWindow w;
  EXPECT_EQ(w.percentile(0.5), 0u);
  for (std::uint64_t ns = 100; ns >= 1; --ns) w.add(ns);  // 1..100, in reverse
  EXPECT_EQ(w.size(), 100u);
  EXPECT_EQ(w.percentile(0.5), 50u);
  EXPECT_EQ(w.percentile(0.99), 99u);
  EXPECT_EQ(w.percentile(1.0), 100u);
  // Only the last kCapacity steps count: 128 steps of 7 push the others out.
  for (std::size_t i = 0; i < StepWindow::kCapacity; ++i) w.add(7);
  EXPECT_EQ(w.size(), StepWindow::kCapacity);
  EXPECT_EQ(w.percentile(0.5), 7u);
  EXPECT_EQ(w.percentile(0.99), 7u);
}

TEST(StepWindow, OneSlowStepInAHundredIsTheP99NotTheMedian) {
  StepWindow w;
  for (int i = 0; i < 99; ++i) w.add(10);
  w.add(1000);
  EXPECT_EQ(w.percentile(0.5), 10u);
  EXPECT_EQ(w.percentile(0.99), 10u);  // the 99th of 100: still a fast one
  w.add(1000);
  EXPECT_EQ(w.percentile(0.99), 1000u);  // 2 of 101 slow
}

TEST(StepTimer, TheFirstStepIsCountedAndTheNextOnesTimed) {
  StepSlot slot;
  StepTimer timer(0);
  timer.step_ended(slot, 1'000);
  EXPECT_EQ(slot.steps.load(), 1u);
  EXPECT_EQ(slot.window.load(), 0u);  // no duration before a second step
  timer.step_ended(slot, 3'000);
  timer.step_ended(slot, 7'000);
  EXPECT_EQ(slot.steps.load(), 3u);
  EXPECT_EQ(slot.last_ns.load(), 4'000u);
  EXPECT_EQ(slot.window.load(), 2u);
  EXPECT_EQ(slot.median_ns.load(), 2'000u);
  EXPECT_EQ(slot.p99_ns.load(), 4'000u);
}

TEST(StepTimer, AFullWindowIsPublishedAtMostOncePerInterval) {
  StepSlot slot;
  StepTimer timer(1'000'000);  // 1 ms
  std::uint64_t t = 1;
  timer.step_ended(slot, t);
  for (std::size_t i = 0; i < StepWindow::kCapacity; ++i) timer.step_ended(slot, t += 10);
  EXPECT_EQ(slot.median_ns.load(), 10u);  // published while the window filled
  for (int i = 0; i < 100; ++i) timer.step_ended(slot, t += 5'000);  // 0.5 ms later
  EXPECT_EQ(slot.median_ns.load(), 10u) << "recomputed before the interval passed";
  EXPECT_EQ(slot.last_ns.load(), 5'000u);
  EXPECT_EQ(slot.steps.load(), 1u + StepWindow::kCapacity + 100u);
  for (int i = 0; i < 100; ++i) timer.step_ended(slot, t += 5'000);  // 1 ms on
  EXPECT_EQ(slot.median_ns.load(), 5'000u);
}

TEST(ProgressBoard, AWorkerFindsItsStepSlotOnANewBoardAndNoneOnAnOldOne) {
  ProgressBoard board = ProgressBoard::create(3);
  auto attached = ProgressBoard::attach(board.fd(), 2, 3);
  ASSERT_TRUE(attached.has_value());
  ASSERT_NE(attached->step_slot(2), nullptr);
  attached->step_slot(2)->steps.store(5);
  attached->slot(2).completed.store(9);
  // The same memory as ddprun's view, each array where it belongs.
  EXPECT_EQ(board.step_slot(2)->steps.load(), 5u);
  EXPECT_EQ(board.slot(2).completed.load(), 9u);
  EXPECT_EQ(board.step_slot(1)->steps.load(), 0u);
  EXPECT_FALSE(ProgressBoard::attach(board.fd(), 3, 3).has_value());

  // An older ddprun's board: three progress slots, nothing after them.
  const int old_fd = memfd_create("old-board", MFD_CLOEXEC);
  ASSERT_GE(old_fd, 0);
  ASSERT_EQ(ftruncate(old_fd, 3 * sizeof(ProgressSlot)), 0);
  auto old = ProgressBoard::attach(old_fd, 2, 3);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->step_slot(2), nullptr);
  old->slot(2).completed.store(4);  // progress is counted as before
  close(old_fd);
}

}  // namespace
}  // namespace ddp
