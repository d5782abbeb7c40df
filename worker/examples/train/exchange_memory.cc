#include "exchange_memory.h"

#include <cstring>
#include <string>

#include "ddp/common/error.h"

namespace train {
namespace {

constexpr std::size_t kAlign = 64;  // every parameter and block on its own cache lines

std::size_t aligned_floats(std::size_t floats) {
  const std::size_t bytes = floats * sizeof(float);
  return (bytes + kAlign - 1) / kAlign * kAlign / sizeof(float);
}

}  // namespace

ExchangeMemory::ExchangeMemory(ddp::ProcessGroup& group,
                               const std::vector<std::size_t>& param_counts,
                               const std::vector<int>& dims, int batch) {
  if (dims.size() < 2 || batch < 1) {
    throw ddp::Error("ExchangeMemory: needs at least one layer and a batch of at least one row");
  }
  const int world = group.size();
  const std::size_t layers = dims.size() - 1;
  const std::size_t rows = static_cast<std::size_t>(world) * static_cast<std::size_t>(batch);
  // Layout in floats: the parameters, then per layer its inputs and output gradients.
  std::vector<std::size_t> param_at, input_at, grad_at;
  std::size_t total = 0;
  for (std::size_t count : param_counts) {
    param_at.push_back(total);
    total += aligned_floats(count);
  }
  for (std::size_t l = 0; l < layers; ++l) {
    input_at.push_back(total);
    total += aligned_floats(rows * static_cast<std::size_t>(dims[l]));
    grad_at.push_back(total);
    total += aligned_floats(rows * static_cast<std::size_t>(dims[l + 1]));
    exchanged_bytes_ += rows * static_cast<std::size_t>(dims[l] + dims[l + 1]) * sizeof(float);
  }
  const std::size_t bytes = total * sizeof(float);
  if (world == 1) {
    // Nothing to share: private memory (64-byte aligned), zeroed like the shared block.
    memory_ = group.allocate(bytes);
    std::memset(memory_.get(), 0, bytes);
  } else {
    memory_ = group.allocate_node_shared(bytes);
    if (memory_ == nullptr) {
      const std::string mib = std::to_string(bytes >> 20);
      throw ddp::Error("--exchange activations: the " + std::to_string(world) +
                       " ranks cannot share " + mib +
                       " MiB: it needs every rank on one node "
                       "with the shm backend (this group: " +
                       group.backend_name() + ") and room in its segment (DDP_SHM_ARENA_MB)");
    }
    shared_ = true;
  }
  float* base = static_cast<float*>(memory_.get());
  for (std::size_t at : param_at) params_.push_back(base + at);
  blocks_.world = world;
  blocks_.rank = group.rank();
  blocks_.batch = batch;
  for (std::size_t l = 0; l < layers; ++l) {
    blocks_.inputs.push_back(base + input_at[l]);
    blocks_.grads.push_back(base + grad_at[l]);
  }
  blocks_.wait_for_all = [this, &group] {
    const auto start = std::chrono::steady_clock::now();
    if (shared_) group.barrier();
    waited_ms_ +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
}

}  // namespace train
