#pragma once
// Where GradSync put each gradient: what GradSync::layout() returns, so a
// program can see its buckets (sizes, which parameter sits where) as torch's
// DDP logging data shows them. How the buckets are packed is libddp's own
// business (like torch's DDP, compute_bucket_assignment_by_size): parameters
// in the order their gradients are expected to become ready, one (dtype,
// device) per bucket, a first small bucket so communication starts early
// (see docs/gradsync.md). Plain values: copy them freely.

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "ddp/types.h"

namespace ddp {

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

// One line for logs: "3 buckets: 1.00 MiB, 24.99 MiB, 3.01 MiB (float32)".
std::string describe_layout(const BucketLayout& layout);

}  // namespace ddp
