#pragma once
// The data order under live recovery (--on_failure=heal), where the number of
// ranks changes between steps. Every epoch covers the whole dataset once, in
// ddp::DistributedSampler's shuffled order (--seed, set_epoch(e)); each
// committed step takes the next world * batch_size * accumulate samples of it
// (the rest of the epoch at its end), whatever the world size is at that
// step. So every sample of an epoch is in exactly one committed step, and
// the position (epoch, offset) is the only data state a healed rank needs.

#include <cstdint>
#include <span>
#include <vector>

namespace train {

// Where the next step starts: samples of `epoch` already in committed steps.
// Two int64s, so a donor can broadcast it beside the weights.
struct Position {
  std::int64_t epoch = 0;
  std::int64_t offset = 0;
};

class ElasticPlan {
 public:
  // REQUIRES: dataset_size, batch_size, accumulate >= 1.
  ElasticPlan(std::int64_t dataset_size, int batch_size, int accumulate, std::uint64_t seed);

  // How many samples the step at `at` takes with `world` ranks.
  std::int64_t step_samples(const Position& at, int world) const;
  // The position after that step.
  Position after(const Position& at, int world) const;
  // The dataset indices rank `rank` reads in micro-batch `micro` of the step
  // at `at`: slice micro * world + rank of the step's samples cut into
  // world * accumulate near-equal slices (each batch_size long but at an
  // epoch's end, where some may be empty). Valid until the next call.
  std::span<const std::int64_t> slice(const Position& at, int world, int rank, int micro);

 private:
  const std::vector<std::int64_t>& order(std::int64_t epoch);

  std::int64_t size_;
  int batch_size_, accumulate_;
  std::uint64_t seed_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace train
