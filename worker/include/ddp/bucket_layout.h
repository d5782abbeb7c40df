#pragma once
// Where GradSync puts each gradient: the pure part of the bucket manager, with
// no process group and no memory (so it is tested directly, and every rank
// computes the same layout from the same inputs).
//
// Parameters are taken in an order — the order their gradients are expected
// to become ready: reverse registration order at first (the backward pass
// visits layers last to first), later the order actually observed — and
// packed into buckets of one (dtype, device) each, like torch's DDP
// (compute_bucket_assignment_by_size):
// - each (dtype, device) group fills its own open bucket;
// - a bucket closes as soon as its size reaches its limit, so the tensor that
//   crosses the limit stays in it (a bucket may exceed its limit by that one
//   tensor; a tensor larger than the limit gets a bucket of its own);
// - the first bucket of each (dtype, device) group closes at
//   `first_bucket_bytes` (small, so communication starts early), the later
//   ones at `bucket_cap_bytes`;
// - buckets are numbered by the position of their first parameter in the
//   order, i.e. by when they are expected to fill; within a bucket, slots
//   follow the order too (offsets are contiguous, no padding).

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "ddp/types.h"

namespace ddp {

// A parameter as the layout sees it.
struct LayoutParam {
  std::size_t count = 0;  // elements
  DType dtype = DType::kFloat32;
  int device = -1;  // -1: host memory; >= 0: a CUDA device
};

// One parameter's gradient inside a bucket.
struct BucketSlot {
  std::size_t param = 0;   // index in the parameter list
  std::size_t offset = 0;  // elements from the start of the bucket
  std::size_t count = 0;   // elements
  bool operator==(const BucketSlot&) const = default;
};

struct LayoutBucket {
  DType dtype = DType::kFloat32;
  int device = -1;
  std::size_t count = 0;  // elements (the sum of the slots' counts)
  std::vector<BucketSlot> slots;
  std::size_t bytes() const { return count * dtype_size(dtype); }
  bool operator==(const LayoutBucket&) const = default;
};

struct BucketLayout {
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::vector<LayoutBucket> buckets;
  // Per parameter: its bucket and its slot in that bucket; kNone for
  // parameters the order leaves out (frozen ones).
  std::vector<std::size_t> bucket_of;
  std::vector<std::size_t> slot_of;
  // The order the layout was built from.
  std::vector<std::size_t> order;

  const BucketSlot& slot(std::size_t param) const {
    return buckets[bucket_of[param]].slots[slot_of[param]];
  }
  std::size_t total_bytes() const;
  bool operator==(const BucketLayout&) const = default;
};

// Packs the parameters listed in `order` (indices into `params`, each at most
// once; parameters not listed get no slot) as described above.
// REQUIRES: first_bucket_bytes > 0 and bucket_cap_bytes > 0 (else ddp::Error);
// every index in range and listed once (else ddp::Error naming it).
BucketLayout make_bucket_layout(const std::vector<LayoutParam>& params,
                                const std::vector<std::size_t>& order,
                                std::size_t first_bucket_bytes, std::size_t bucket_cap_bytes);

// The indices i with trainable[i], last first: the initial order.
std::vector<std::size_t> reverse_registration_order(const std::vector<bool>& trainable);

// The order of a rebuild: `observed` (the parameters in the order their
// gradients became ready; each at most once, each in `fallback`) followed by
// the parameters of `fallback` that were never observed, in fallback's order.
// Throws ddp::Error naming an index that is out of range, repeated, or not in
// `fallback` (a frozen parameter).
std::vector<std::size_t> rebuild_order(const std::vector<std::size_t>& observed,
                                       const std::vector<std::size_t>& fallback);

// One line for logs: "3 buckets: 1.00 MiB, 24.99 MiB, 3.01 MiB (float32)".
std::string describe_layout(const BucketLayout& layout);

}  // namespace ddp
