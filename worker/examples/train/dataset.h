#pragma once
// The synthetic dataset: made entirely from the seed, identically on every
// rank (and on every run), so no file is read and every rank can serve any
// index.
//
// Features are standard normal. The targets come from a fixed random
// "teacher" network (input_dim -> 64 tanh units -> output_dim), so there is
// something learnable:
//   regression:     y = teacher(x) + 0.05 * noise           (output_dim values)
//   classification: label = argmax teacher(x)                (output_dim classes)
// The random numbers are SplitMix64 streams (see random.h), not <random>'s
// distributions, whose output differs between standard libraries.

#include <cstdint>
#include <span>
#include <vector>

#include "flags.h"

namespace train {

// One micro-batch, in the layout the model reads: row-major, one row per sample.
struct Batch {
  int size = 0;
  std::vector<float> x;              // size * input_dim
  std::vector<float> y;              // size * output_dim (regression)
  std::vector<std::int32_t> labels;  // size (classification)
};

class SyntheticDataset {
 public:
  // REQUIRES: size >= 1, input_dim >= 1, output_dim >= 1 (>= 2 for classification).
  SyntheticDataset(Task task, std::int64_t size, int input_dim, int output_dim, std::uint64_t seed);

  std::int64_t size() const { return size_; }
  Task task() const { return task_; }
  int input_dim() const { return input_dim_; }
  int output_dim() const { return output_dim_; }

  // Copies the samples `indices` (each in [0, size())) into `batch`.
  void gather(std::span<const std::int64_t> indices, Batch& batch) const;

 private:
  Task task_;
  std::int64_t size_;
  int input_dim_, output_dim_;
  std::vector<float> x_;              // size * input_dim
  std::vector<float> y_;              // size * output_dim (regression)
  std::vector<std::int32_t> labels_;  // size (classification)
};

}  // namespace train
