#pragma once
// Which samples each rank reads at each step: the determinism scheme.
//
// Every epoch, ddp::DistributedSampler (shuffle, seed = --seed, set_epoch(e))
// gives the same permutation P on every rank (padded to a multiple of the
// world size W by repeating its start), and rank r takes the positions r,
// r + W, r + 2W, ... Micro-batch m of the epoch (m = step * A + k for
// --accumulate A) is rank r's local positions [m*b, (m+1)*b), i.e. the
// permutation positions r + W*(m*b + j), j < b. Over the ranks those are
// exactly the positions [m*b*W, (m+1)*b*W) of P: with the global micro-batch
// G = b*W held fixed, every step trains on the same set of samples whatever
// W is, so runs with 1, 2 or 4 ranks follow the same loss curve (up to the
// float rounding of summing in a different order).
//
// Uneven data: the sampler pads (no drop_last), so every rank has the same
// num_samples = ceil(n / W) per epoch, and an epoch is
// floor(num_samples / (b*A)) steps on every rank: an incomplete last batch
// is dropped (as DataLoader(drop_last=True) does). Every rank therefore runs
// the same number of steps and collectives, and nothing waits for a rank that
// ran out of data. When W divides n no sample repeats; otherwise up to W-1
// samples are read twice per epoch (torch's DistributedSampler does the same).

#include <cstdint>
#include <span>
#include <vector>

#include "ddp/sampler.h"

namespace train {

// floor(ceil(dataset_size / world_size) / (batch_size * accumulate)).
std::int64_t steps_per_epoch(std::int64_t dataset_size, int world_size, int batch_size,
                             int accumulate);

class DataPlan {
 public:
  // Throws ddp::Error naming the flags when an epoch would have no step.
  DataPlan(std::int64_t dataset_size, int world_size, int rank, int batch_size, int accumulate,
           std::uint64_t seed);

  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t epoch_of(std::int64_t step) const { return step / steps_per_epoch_; }
  // This rank's batch_size dataset indices for micro-batch `micro` (0 <=
  // micro < accumulate) of optimizer step `step` (0-based, counted from the
  // start of training). The span is valid until the next call.
  std::span<const std::int64_t> micro_batch(std::int64_t step, int micro);

 private:
  ddp::DistributedSampler sampler_;
  int batch_size_, accumulate_;
  std::int64_t steps_per_epoch_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> indices_;  // this rank's indices of cached_epoch_
};

}  // namespace train
