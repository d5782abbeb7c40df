#pragma once
// The data, and which samples each rank reads at each step (docs/train.md
// has the details).
//
// Every rank holds the whole dataset in memory, the same on every rank. The
// synthetic set is made from the seed: standard normal features, targets
// from a fixed random "teacher" network (64 tanh units): its outputs plus
// 0.05 noise (regression) or their argmax (classification). The digits are
// scikit-learn's 1,797 8x8 images of handwritten digits (a CSV row each: 64
// pixels 0..16, then the label), pixels scaled to [0, 1]; a fixed fifth of
// them (the same whatever --seed) is held out as the test set.
//
// DataPlan: every epoch ddp::DistributedSampler (shuffle, --seed,
// set_epoch(e)) gives every rank the same permutation P, padded to a
// multiple of the world size W, and rank r the positions r, r + W, ...
// Micro-batch m of the epoch is rank r's local positions [m*b, (m+1)*b):
// over the ranks, exactly the positions [m*b*W, (m+1)*b*W) of P. So with the
// global batch b*W fixed every step trains on the same samples whatever W
// is. Every rank has ceil(n / W) samples per epoch, and an epoch is
// floor(ceil(n / W) / (b * accumulate)) steps on every rank.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ddp/sampler.h"
#include "flags.h"

namespace train {

// One micro-batch, in the layout the model reads: row-major, one row per sample.
struct Batch {
  int size = 0;
  std::vector<float> x;              // size * input_dim
  std::vector<float> y;              // size * output_dim (regression)
  std::vector<std::int32_t> labels;  // size (classification)
};

struct Dataset {
  Task task = Task::kClassification;
  int input_dim = 0, output_dim = 0;
  std::vector<float> x;              // size() * input_dim
  std::vector<float> y;              // size() * output_dim (regression)
  std::vector<std::int32_t> labels;  // size() (classification)

  std::int64_t size() const {
    return input_dim > 0 ? static_cast<std::int64_t>(x.size()) / input_dim : 0;
  }
  // Copies the samples `indices` (each in [0, size())) into `batch`.
  void gather(std::span<const std::int64_t> indices, Batch& batch) const;
};

// The training set, and the held-out test set (empty for the synthetic data).
struct Data {
  Dataset train, test;
};

// REQUIRES: size >= 1, input_dim >= 1, output_dim >= 1 (>= 2 for classification).
Dataset make_synthetic(Task task, std::int64_t size, int input_dim, int output_dim,
                       std::uint64_t seed);
// Reads the digits from `path` (gzip'd CSV); throws ddp::Error naming the
// file and the problem.
Data load_digits(const std::string& path);
// What config.data names.
Data load_data(const Config& config);

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
