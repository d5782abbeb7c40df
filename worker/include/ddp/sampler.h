#pragma once
// Which dataset indices each rank reads: PyTorch's DistributedSampler
// (torch.utils.data.distributed.DistributedSampler) for C++ trainers, and the
// plain offset shard (`index % world_size == rank`).
//
// DistributedSampler reproduces torch's arithmetic exactly:
//   num_samples = drop_last ? dataset_size / num_replicas          (floor)
//                           : ceil(dataset_size / num_replicas)
//   total_size  = num_samples * num_replicas
// The epoch's order (a permutation, or 0..n-1 without shuffle) is padded to
// total_size by repeating it from the start, as many times as needed (a
// dataset smaller than num_replicas is repeated more than once), or cut to
// total_size with drop_last; rank r then takes positions r, r + num_replicas,
// r + 2 * num_replicas, ... (torch's indices[rank:total_size:num_replicas]).
// So every rank gets size() indices, the same count on every rank; without
// drop_last the union covers the dataset, with drop_last no index repeats.
//
// Without shuffle the indices are exactly torch's. With shuffle the order is
// random_permutation(dataset_size, seed + epoch) below: the same on every rank,
// instance, compiler and standard library, but NOT bit-for-bit torch's
// torch.randperm (which depends on torch's Philox/MT19937 internals and on
// torch's version), so a C++ and a Python trainer sharing a job shuffle
// differently. The counts, padding and striding are torch's in both cases.

#include <cstdint>
#include <vector>

namespace ddp {

struct SamplerOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // REQUIRES: dataset_size >= 0, num_replicas >= 1, 0 <= rank < num_replicas;
  // otherwise throws ddp::Error (ddp/common/error.h) naming the argument and its value.
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     std::uint64_t seed = 0, bool drop_last = false);
  // num_replicas and rank from the environment contract (ddp::world_size(),
  // ddp::rank()): a world of one without the launcher's variables.
  // E.g. DistributedSampler(n, {.shuffle = false}).
  explicit DistributedSampler(std::int64_t dataset_size, const SamplerOptions& options = {});

  // The epoch mixed into the shuffle (seed + epoch). Call it at the start of
  // every epoch, with the same value on every rank, or every epoch has the same order.
  void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
  std::int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch: size() values in [0, dataset_size).
  // O(dataset_size) with shuffle (the whole permutation is built, as torch does),
  // O(size()) without.
  std::vector<std::int64_t> indices() const;
  // num_samples: how many indices every rank gets per epoch.
  std::int64_t size() const { return num_samples_; }
  // num_samples * num_replicas: the padded (or cut) length of the epoch.
  std::int64_t total_size() const { return num_samples_ * num_replicas_; }

  std::int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  std::uint64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }

 private:
  std::int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t num_samples_;
  std::int64_t epoch_ = 0;
};

// The permutation of 0..n-1 DistributedSampler uses for `seed` (= its seed +
// epoch). Fully specified, so any language can reproduce it:
//   state = seed; next() = SplitMix64 (state += 0x9E3779B97F4A7C15; z = state;
//     z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) * 0x94D049BB133111EB;
//     return z ^ z >> 31), all arithmetic mod 2^64;
//   below(b) = the first next() value r with r >= (2^64 - b) % b, then r % b (unbiased);
//   p = [0, 1, ..., n-1]; for i = n-1 down to 1: swap(p[i], p[below(i + 1)]).
// (std::shuffle and std::uniform_int_distribution are not used: their output
// differs between standard libraries.) REQUIRES: n >= 0.
std::vector<std::int64_t> random_permutation(std::int64_t n, std::uint64_t seed);

// The simple offset shard: the indices i in [0, dataset_size) with
// i % num_replicas == rank, ascending. No padding: ranks below
// dataset_size % num_replicas get one index more than the others, and every
// index is read exactly once across ranks. Same REQUIRES as DistributedSampler.
std::vector<std::int64_t> strided_shard(std::int64_t dataset_size, int num_replicas, int rank);
// num_replicas and rank from the environment contract.
std::vector<std::int64_t> strided_shard(std::int64_t dataset_size);

}  // namespace ddp
