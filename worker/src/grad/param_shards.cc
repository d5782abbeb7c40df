#include "ddp/param_shards.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "ddp/common/error.h"
#include "ddp/heal.h"

namespace ddp {
namespace {

constexpr std::size_t kAlign = 64;  // a cache line: no two ranks write the same line

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

ElementRange ShardLayout::owned(std::size_t param, int rank) const {
  const std::size_t lo = offsets[param], hi = lo + counts[param] * element_sizes[param];
  const std::size_t slice_lo = static_cast<std::size_t>(rank) * slice_bytes,
                    slice_hi = slice_lo + slice_bytes;
  const std::size_t from = std::max(lo, slice_lo), to = std::min(hi, slice_hi);
  if (from >= to) return {};
  // Offsets and slice bounds are multiples of 64, so both ends fall on elements.
  return {(from - lo) / element_sizes[param], (to - lo) / element_sizes[param]};
}

ShardLayout make_shard_layout(const std::vector<std::size_t>& counts,
                              const std::vector<std::size_t>& element_sizes, int world_size) {
  if (world_size < 1)
    throw Error("ParamShards: world size must be >= 1, got " + std::to_string(world_size));
  if (counts.size() != element_sizes.size())
    throw Error("ParamShards: one element size per parameter");
  ShardLayout layout;
  layout.world_size = world_size;
  layout.counts = counts;
  layout.element_sizes = element_sizes;
  std::size_t at = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const std::size_t e = element_sizes[i];
    if (e != 1 && e != 2 && e != 4 && e != 8) {
      throw Error("ParamShards: parameter " + std::to_string(i) + " has elements of " +
                  std::to_string(e) + " bytes (1, 2, 4 or 8 expected)");
    }
    layout.offsets.push_back(at);
    at = round_up(at + counts[i] * e, kAlign);
  }
  layout.total_bytes =
      round_up(std::max<std::size_t>(at, 1), kAlign * static_cast<std::size_t>(world_size));
  layout.slice_bytes = layout.total_bytes / static_cast<std::size_t>(world_size);
  return layout;
}

ParamShards::ParamShards(ProcessGroup& group, const std::vector<GradParam>& params,
                         ShardOptions options)
    : group_(&group), rank_(group.rank()), replicas_(options.replicas) {
  // Its buffers are read and written on the CPU; nccl's allocate() is device memory.
  if (group.backend_name() == "nccl") {
    throw Error("ParamShards: host memory only, and this group's backend is nccl (device memory)");
  }
  std::vector<std::size_t> counts, sizes;
  for (const auto& p : params) {
    if (p.device >= 0) {
      throw Error("ParamShards: parameter '" + p.name + "' is on CUDA device " +
                  std::to_string(p.device) + " (host memory only)");
    }
    counts.push_back(p.count());
    sizes.push_back(dtype_size(p.dtype));
    dtypes_.push_back(p.dtype);
  }
  layout_ = make_shard_layout(counts, sizes, group.size());
  if (!replicas_) buffer_ = group.allocate_node_shared(layout_.total_bytes);  // collective
  node_shared_ = buffer_ != nullptr;
  if (!node_shared_) {
    buffer_ = group.allocate(layout_.total_bytes);
    std::memset(buffer_.get(), 0, layout_.total_bytes);
  }
}

void ParamShards::check_index(std::size_t index) const {
  if (index >= num_params()) {
    throw Error("ParamShards: parameter index " + std::to_string(index) + " out of range (" +
                std::to_string(num_params()) + " parameters)");
  }
}

void* ParamShards::data(std::size_t index) {
  check_index(index);
  return static_cast<char*>(buffer_.get()) + layout_.offsets[index];
}

float* ParamShards::view(std::size_t index) {
  check_index(index);
  if (dtypes_[index] != DType::kFloat32) {
    throw Error("ParamShards::view: parameter " + std::to_string(index) + " is " +
                dtype_name(dtypes_[index]) + ", not float32");
  }
  return static_cast<float*>(data(index));
}

ElementRange ParamShards::owned(std::size_t index) const {
  check_index(index);
  return layout_.owned(index, rank_);
}

ElementRange ParamShards::replica(std::size_t index) const {
  check_index(index);
  if (!replicas_ || layout_.world_size == 1) return {};
  return layout_.owned(index, (rank_ + layout_.replica_shift()) % layout_.world_size);
}

void ParamShards::all_gather() {
  if (group_->size() == 1) return;  // one rank owns everything
  // One copy for the whole node: every rank already sees every update; the
  // barrier only keeps anyone from reading before all have written.
  if (node_shared_) return group_->barrier();
  // In place: this rank's slice is already where the gather puts it.
  char* base = static_cast<char*>(buffer_.get());
  group_->all_gather(base + static_cast<std::size_t>(group_->rank()) * layout_.slice_bytes, base,
                     layout_.slice_bytes, DType::kUInt8);
}

void ParamShards::all_gather(const std::vector<void*>& buffers) {
  if (buffers.size() != num_params()) {
    throw Error("ParamShards::all_gather: " + std::to_string(buffers.size()) + " buffers for " +
                std::to_string(num_params()) + " parameters");
  }
  if (group_->size() == 1) return;
  std::shared_ptr<void> staging = group_->allocate(layout_.total_bytes);
  char* base = static_cast<char*>(staging.get());
  const int me = group_->rank();
  auto bytes_of = [&](std::size_t i, const ElementRange& r) {
    return std::pair{r.begin * layout_.element_sizes[i], r.size() * layout_.element_sizes[i]};
  };
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr) continue;
    auto [at, len] = bytes_of(i, layout_.owned(i, me));
    std::memcpy(base + layout_.offsets[i] + at, static_cast<char*>(buffers[i]) + at, len);
  }
  group_->all_gather(base + static_cast<std::size_t>(me) * layout_.slice_bytes, base,
                     layout_.slice_bytes, DType::kUInt8);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr) continue;
    for (int r = 0; r < layout_.world_size; ++r) {
      if (r == me) continue;
      auto [at, len] = bytes_of(i, layout_.owned(i, r));
      std::memcpy(static_cast<char*>(buffers[i]) + at, base + layout_.offsets[i] + at, len);
    }
  }
}

namespace {

// Old rank `slice`'s bytes of every buffer set, packed at their offsets in
// the slice (set k at k * slice_bytes), or unpacked from there.
void copy_slice(const ShardLayout& old, int slice, const std::vector<std::vector<void*>>& sets,
                char* staging, bool pack) {
  const std::size_t slice_begin = static_cast<std::size_t>(slice) * old.slice_bytes;
  for (std::size_t k = 0; k < sets.size(); ++k) {
    for (std::size_t i = 0; i < sets[k].size(); ++i) {
      if (sets[k][i] == nullptr) continue;
      const ElementRange r = old.owned(i, slice);
      if (r.empty()) continue;
      const std::size_t at = r.begin * old.element_sizes[i], len = r.size() * old.element_sizes[i];
      char* held = static_cast<char*>(sets[k][i]) + at;
      char* staged = staging + k * old.slice_bytes + old.offsets[i] + at - slice_begin;
      if (pack) {
        std::memcpy(staged, held, len);
      } else {
        std::memcpy(held, staged, len);
      }
    }
  }
}

}  // namespace

std::uint64_t ParamShards::restore(ProcessGroup& group, const ShardLayout& old,
                                   const std::vector<int>& held_as,
                                   const std::vector<std::vector<void*>>& sets) {
  if (held_as.size() != static_cast<std::size_t>(group.size())) {
    throw Error("ParamShards::restore: held_as has " + std::to_string(held_as.size()) +
                " entries for a group of " + std::to_string(group.size()));
  }
  for (const auto& set : sets) {
    if (set.size() != old.counts.size()) {
      throw Error("ParamShards::restore: a set of " + std::to_string(set.size()) + " buffers for " +
                  std::to_string(old.counts.size()) + " parameters");
    }
  }
  const int n = old.world_size;
  auto member_that_was = [&](int old_rank) {
    const auto it = std::find(held_as.begin(), held_as.end(), old_rank);
    return it == held_as.end() ? -1 : static_cast<int>(it - held_as.begin());
  };
  std::vector<char> staging(old.slice_bytes * sets.size());
  std::uint64_t sent = 0;
  for (int slice = 0; slice < n; ++slice) {
    const int keeper = (slice + n - old.replica_shift()) % n;  // the rank that kept its replica
    int from = member_that_was(slice);
    if (from < 0) from = member_that_was(keeper);
    if (from < 0) {
      throw HealError("the sharded state of old rank " + std::to_string(slice) + " of " +
                      std::to_string(n) + " is held by no live member (it and old rank " +
                      std::to_string(keeper) + ", which kept its replica, both left)");
    }
    if (group.size() == 1) continue;  // the one member holds it already
    if (group.rank() == from) copy_slice(old, slice, sets, staging.data(), true);
    group.broadcast(staging.data(), staging.size(), DType::kUInt8, from);
    if (group.rank() != from) copy_slice(old, slice, sets, staging.data(), false);
    sent += staging.size();
  }
  return sent;
}

}  // namespace ddp
