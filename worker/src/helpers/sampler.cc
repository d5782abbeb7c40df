#include "ddp/sampler.h"

#include <string>
#include <utility>

#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace ddp {
namespace {

void check_arguments(const char* what, std::int64_t dataset_size, int num_replicas, int rank) {
  const std::string prefix = std::string(what) + ": ";
  if (dataset_size < 0) {
    throw Error(prefix + "dataset_size must be >= 0, got " + std::to_string(dataset_size));
  }
  if (num_replicas < 1) {
    throw Error(prefix + "num_replicas must be >= 1, got " + std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw Error(prefix + "rank " + std::to_string(rank) +
                " is outside [0, num_replicas=" + std::to_string(num_replicas) + ")");
  }
}

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fully specified, and good enough
// to drive a shuffle. Its exact definition is in sampler.h.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) without modulo bias: values below 2^64 mod bound are
  // rejected, so the accepted range is a whole multiple of bound.
  std::uint64_t below(std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      std::uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace

std::vector<std::int64_t> random_permutation(std::int64_t n, std::uint64_t seed) {
  if (n < 0) throw Error("random_permutation: n must be >= 0, got " + std::to_string(n));
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
  SplitMix64 rng(seed);
  for (std::int64_t i = n - 1; i >= 1; --i) {
    auto j = rng.below(static_cast<std::uint64_t>(i) + 1);
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank,
                                       bool shuffle, std::uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_arguments("DistributedSampler", dataset_size, num_replicas, rank);
  // torch: drop_last and an uneven split -> ceil((n - R) / R), which is n / R
  // (floor) for every n >= 0, including n < R where it is 0; else ceil(n / R).
  num_samples_ =
      drop_last ? dataset_size / num_replicas : (dataset_size + num_replicas - 1) / num_replicas;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, const SamplerOptions& options)
    : DistributedSampler(dataset_size, ddp::world_size(), ddp::rank(), options.shuffle,
                         options.seed, options.drop_last) {}

std::vector<std::int64_t> DistributedSampler::indices() const {
  std::vector<std::int64_t> order;
  if (shuffle_ && num_samples_ > 0) {
    order = random_permutation(dataset_size_, seed_ + static_cast<std::uint64_t>(epoch_));
  }
  // Padding repeats the order from its start, so padded position g holds
  // order[g % n]; with drop_last every g < total_size <= n. Rank r takes
  // positions r, r + R, r + 2R, ... below total_size.
  std::vector<std::int64_t> mine(static_cast<std::size_t>(num_samples_));
  for (std::int64_t k = 0; k < num_samples_; ++k) {
    std::int64_t position = (rank_ + k * num_replicas_) % dataset_size_;
    mine[static_cast<std::size_t>(k)] =
        order.empty() ? position : order[static_cast<std::size_t>(position)];
  }
  return mine;
}

std::vector<std::int64_t> strided_shard(std::int64_t dataset_size, int num_replicas, int rank) {
  check_arguments("strided_shard", dataset_size, num_replicas, rank);
  std::vector<std::int64_t> mine;
  if (rank < dataset_size)
    mine.reserve(static_cast<std::size_t>((dataset_size - rank - 1) / num_replicas + 1));
  for (std::int64_t i = rank; i < dataset_size; i += num_replicas) mine.push_back(i);
  return mine;
}

std::vector<std::int64_t> strided_shard(std::int64_t dataset_size) {
  return strided_shard(dataset_size, ddp::world_size(), ddp::rank());
}

}  // namespace ddp
