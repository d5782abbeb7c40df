#pragma once
// How GradSync packs gradients into buckets (internal to libddp): pure, with
// no process group and no memory, so it is tested directly and every rank
// computes the same layout from the same inputs.
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
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/types.h"

namespace ddp {

// A parameter as the layout sees it.
struct LayoutParam {
  std::size_t count = 0;  // elements
  DType dtype = DType::kFloat32;
  int device = -1;  // -1: host memory; >= 0: a CUDA device
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

}  // namespace ddp
