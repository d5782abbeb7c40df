#include "exchange_memory.h"

#include <sched.h>

#include <atomic>
#include <cstring>
#include <string>

#include "ddp/common/error.h"
#include "ddp/ddp.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace train {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kAlign = 64;  // every buffer and control word on its own cache lines

std::size_t aligned_floats(std::size_t floats) {
  const std::size_t bytes = floats * sizeof(float);
  return (bytes + kAlign - 1) / kAlign * kAlign / sizeof(float);
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

ExchangeMemory::ExchangeMemory(ddp::ProcessGroup& group,
                               const std::vector<std::size_t>& param_counts,
                               std::size_t state_groups, const std::vector<int>& dims, int batch)
    : group_(group) {
  if (dims.size() < 2 || batch < 1) {
    throw ddp::Error("ExchangeMemory: needs at least one layer and a batch of at least one row");
  }
  const int world = group.size();
  const std::size_t layers = dims.size() - 1;
  const std::size_t rows = static_cast<std::size_t>(world) * static_cast<std::size_t>(batch);
  // Layout in floats: the control words, the parameters, their gradients, the
  // optimizer's state, then per layer its inputs and output gradients.
  std::size_t total = aligned_floats((static_cast<std::size_t>(world) + 1) * ExchangeBlocks::kStride *
                                     sizeof(std::int64_t) / sizeof(float));
  const auto place_params = [&] {
    std::vector<std::size_t> at;
    for (std::size_t count : param_counts) {
      at.push_back(total);
      total += aligned_floats(count);
    }
    return at;
  };
  const std::vector<std::size_t> param_at = place_params(), grad_at = place_params();
  std::vector<std::vector<std::size_t>> state_at;
  for (std::size_t g = 0; g < state_groups; ++g) state_at.push_back(place_params());
  std::vector<std::size_t> input_at, output_grad_at;
  for (std::size_t l = 0; l < layers; ++l) {
    input_at.push_back(total);
    total += aligned_floats(rows * static_cast<std::size_t>(dims[l]));
    output_grad_at.push_back(total);
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
  const auto pointers = [base](const std::vector<std::size_t>& at) {
    std::vector<float*> out;
    for (std::size_t a : at) out.push_back(base + a);
    return out;
  };
  params_ = pointers(param_at);
  grads_ = pointers(grad_at);
  for (const auto& at : state_at) state_.push_back(pointers(at));
  blocks_.world = world;
  blocks_.rank = group.rank();
  blocks_.batch = batch;
  blocks_.inputs = pointers(input_at);
  blocks_.grads = pointers(output_grad_at);
  auto* control = static_cast<std::int64_t*>(memory_.get());
  blocks_.published_counts = control;
  blocks_.next_ticket = control + static_cast<std::size_t>(world) * ExchangeBlocks::kStride;
  blocks_.wait_for_published = [this](std::int64_t count) { wait_for_published(count); };
  blocks_.wait_for_all = [this] {
    const auto start = Clock::now();
    if (shared_) group_.barrier();
    waited_ms_ += ms_since(start);
  };
}

void ExchangeMemory::wait_for_published(std::int64_t count) {
  const auto behind = [&]() -> int {
    for (int r = 0; r < blocks_.world; ++r) {
      if (std::atomic_ref<std::int64_t>(*blocks_.published(r)).load(std::memory_order_acquire) <
          count)
        return r;
    }
    return -1;
  };
  if (behind() < 0) return;
  // Spin briefly (the other ranks are a few microseconds away when they have
  // cores of their own), then yield the core: with more ranks than cores the
  // rank we wait for may need this one.
  const auto start = Clock::now();
  const bool oversubscribed = blocks_.world > ddp::node_cpus();
  const auto timeout = group_.timeout();
  for (long spins = 0;; ++spins) {
    const int r = behind();
    if (r < 0) break;
    if (oversubscribed || spins > 2000) {
      sched_yield();
    } else {
#if defined(__x86_64__)
      _mm_pause();
#endif
    }
    if (spins % 1024 == 0 && Clock::now() - start > timeout) {
      throw ddp::Error("--exchange activations: rank " + std::to_string(r) +
                       " did not publish its layer gradients within the group's timeout of " +
                       std::to_string(timeout.count()) + " ms (it died or is stuck)");
    }
  }
  waited_ms_ += ms_since(start);
}

}  // namespace train
