#include "elastic_plan.h"

#include <algorithm>

#include "ddp/sampler.h"

namespace train {

ElasticPlan::ElasticPlan(std::int64_t dataset_size, int batch_size, int accumulate,
                         std::uint64_t seed)
    : size_(dataset_size), batch_size_(batch_size), accumulate_(accumulate), seed_(seed) {}

std::int64_t ElasticPlan::step_samples(const Position& at, int world) const {
  const std::int64_t full = std::int64_t{world} * batch_size_ * accumulate_;
  return std::min(full, size_ - at.offset);
}

Position ElasticPlan::after(const Position& at, int world) const {
  Position next{at.epoch, at.offset + step_samples(at, world)};
  if (next.offset >= size_) next = {at.epoch + 1, 0};
  return next;
}

const std::vector<std::int64_t>& ElasticPlan::order(std::int64_t epoch) {
  if (epoch != cached_epoch_) {
    // One replica: the whole epoch's permutation, unpadded.
    ddp::DistributedSampler sampler(size_, 1, 0, /*shuffle=*/true, seed_);
    sampler.set_epoch(epoch);
    order_ = sampler.indices();
    cached_epoch_ = epoch;
  }
  return order_;
}

std::span<const std::int64_t> ElasticPlan::slice(const Position& at, int world, int rank,
                                                 int micro) {
  const std::int64_t samples = step_samples(at, world);
  const std::int64_t slices = std::int64_t{world} * accumulate_;
  const std::int64_t k = std::int64_t{micro} * world + rank;
  const std::int64_t begin = at.offset + k * samples / slices;
  const std::int64_t end = at.offset + (k + 1) * samples / slices;
  const auto& all = order(at.epoch);
  return std::span<const std::int64_t>(all.data() + begin, static_cast<std::size_t>(end - begin));
}

}  // namespace train
