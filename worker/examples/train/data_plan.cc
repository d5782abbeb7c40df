#include "data_plan.h"

#include <string>

#include "ddp/common/error.h"

namespace train {

std::int64_t steps_per_epoch(std::int64_t dataset_size, int world_size, int batch_size,
                             int accumulate) {
  const std::int64_t per_rank = (dataset_size + world_size - 1) / world_size;
  return per_rank / (static_cast<std::int64_t>(batch_size) * accumulate);
}

DataPlan::DataPlan(std::int64_t dataset_size, int world_size, int rank, int batch_size,
                   int accumulate, std::uint64_t seed)
    : sampler_(dataset_size, world_size, rank, /*shuffle=*/true, seed, /*drop_last=*/false),
      batch_size_(batch_size),
      accumulate_(accumulate),
      steps_per_epoch_(train::steps_per_epoch(dataset_size, world_size, batch_size, accumulate)) {
  if (steps_per_epoch_ < 1) {
    throw ddp::Error("--dataset_size " + std::to_string(dataset_size) + " gives each of " +
                     std::to_string(world_size) + " rank(s) " + std::to_string(sampler_.size()) +
                     " samples per epoch, fewer than one step needs (--batch_size " +
                     std::to_string(batch_size) + " x --accumulate " + std::to_string(accumulate) +
                     ")");
  }
}

std::span<const std::int64_t> DataPlan::micro_batch(std::int64_t step, int micro) {
  const std::int64_t epoch = epoch_of(step);
  if (epoch != cached_epoch_) {
    sampler_.set_epoch(epoch);
    indices_ = sampler_.indices();
    cached_epoch_ = epoch;
  }
  const std::int64_t m = (step - epoch * steps_per_epoch_) * accumulate_ + micro;
  return std::span<const std::int64_t>(indices_).subspan(static_cast<std::size_t>(m * batch_size_),
                                                         static_cast<std::size_t>(batch_size_));
}

}  // namespace train
