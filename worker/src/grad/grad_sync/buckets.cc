// GradSync's buckets: their memory (ProcessGroup::allocate(), device memory
// for device parameters), and launching their all-reduces strictly in index
// order, each prepared for the wire: scaled, compressed to 16 bits, the
// status word set, or cut to this rank's elements (partial).

#include <cstring>

#include "device/device_memory.h"
#include "grad/grad_sync/impl.h"
#include "kernels/reduce_kernels.h"

namespace ddp {

void GradSync::Impl::apply_layout(BucketLayout fresh_layout, bool keep_values) {
  const int world = group.size();
  std::vector<std::unique_ptr<Bucket>> fresh;
  for (std::size_t b = 0; b < fresh_layout.buckets.size(); ++b) {
    const LayoutBucket& lb = fresh_layout.buckets[b];
    auto bucket = std::make_unique<Bucket>();
    bucket->has_status = b + 1 == fresh_layout.buckets.size();
    const std::size_t elements = lb.count + (bucket->has_status ? 1 : 0);
    const std::size_t bytes = elements * dtype_size(lb.dtype);
    if (device_buckets && world == 1) {
      // A world of one runs the local backend, whose allocate() is host
      // memory: the memory the nccl backend's allocate() would give.
      bucket->buffer = device::allocate(bytes, lb.device);
    } else if (device_buckets) {
      device::Scope scope(lb.device);  // the caller's current device is kept
      bucket->buffer = group.allocate(bytes);
    } else {
      bucket->buffer = group.allocate(bytes);
    }
    if (device_buckets) zero_bytes(bucket->buffer.get(), bytes);  // cudaMemset: cheap
    bucket->compressed = options.compression != Compression::kNone && world > 1 &&
                         (lb.dtype == DType::kFloat32 || lb.dtype == DType::kFloat64);
    if (bucket->compressed) bucket->wire = group.allocate(elements * sizeof(std::uint16_t));
    bucket->pending = lb.slots.size();
    fresh.push_back(std::move(bucket));
  }
  // Host memory is zeroed a parameter at a time when first needed: where the
  // first hand-over stores, never (a large model's buckets are not written
  // twice when a group is rebuilt).
  if (!keep_values) {
    unwritten.assign(params.size(), 0);
    for (std::size_t p = 0; p < params.size(); ++p)
      unwritten[p] = !device_buckets && fresh_layout.bucket_of[p] != BucketLayout::kNone;
  }
  if (keep_values) {
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (fresh_layout.bucket_of[p] == BucketLayout::kNone ||
          layout.bucket_of[p] == BucketLayout::kNone || unwritten[p])
        continue;
      const BucketSlot& from = layout.slot(p);
      const BucketSlot& to = fresh_layout.slot(p);
      const std::size_t element = dtype_size(params[p].dtype);
      const char* src = buckets[layout.bucket_of[p]]->data() + from.offset * element;
      char* dst = fresh[fresh_layout.bucket_of[p]]->data() + to.offset * element;
      if (device_buckets) {
        device::copy(dst, src, from.count * element);
      } else {
        std::memcpy(dst, src, from.count * element);
      }
    }
  }
  layout = std::move(fresh_layout);
  buckets = std::move(fresh);
}

void GradSync::Impl::launch_ready_locked(bool status) {
  while (next_launch < buckets.size() && buckets[next_launch]->pending == 0) {
    launch_locked(next_launch, status);
    ++next_launch;
  }
}

void GradSync::Impl::launch_locked(std::size_t b, bool status) {
  Bucket& bucket = *buckets[b];
  const LayoutBucket& lb = layout.buckets[b];
  const auto now = Clock::now();
  if (!have_first_launch) {
    first_launch = now;
    have_first_launch = true;
  }
  bucket.launched = true;
  ++launched_count;
  const int world = group.size();
  if (world == 1) {  // nothing to reduce with
    bucket.done = true;
    bucket.done_at = now;
    return;
  }
  const std::size_t elements = lb.count + (bucket.has_status ? 1 : 0);
  const double scale = 1.0 / world;
  if (bucket.compressed) {
    const bool half = options.compression == Compression::kFp16;
    const std::size_t element = dtype_size(lb.dtype);
    for (const BucketSlot& slot : lb.slots) {
      compress_to_16(bucket.data() + slot.offset * element, lb.dtype, bucket.wire16() + slot.offset,
                     slot.count, scaled[slot.param] ? 1.0 : scale, half);
    }
    const DType wire = half ? DType::kFloat16 : DType::kBFloat16;
    if (bucket.has_status) store_scalar(bucket.wire16() + lb.count, wire, status ? 1.0 : 0.0);
    start_all_reduce(bucket, bucket.wire.get(), elements, wire, ReduceOp::kSum, nullptr);
    wire_bytes += elements * sizeof(std::uint16_t);
    return;
  }
  ReduceOp op = ReduceOp::kSum;
  if (device_buckets) {
    op = options.prescaled_grads ? ReduceOp::kSum : ReduceOp::kAvg;
  } else {
    std::size_t n_scaled = 0;
    for (const BucketSlot& slot : lb.slots) n_scaled += scaled[slot.param] ? 1 : 0;
    if (n_scaled == 0) {
      op = ReduceOp::kAvg;  // divided after the sum, on the group's thread
    } else if (n_scaled < lb.slots.size()) {
      const std::size_t element = dtype_size(lb.dtype);
      for (const BucketSlot& slot : lb.slots) {
        if (!scaled[slot.param])
          scale_in_place(bucket.data() + slot.offset * element, slot.count, lb.dtype, scale);
      }
    }
  }
  if (bucket.has_status) {
    char* word = bucket.data() + lb.count * dtype_size(lb.dtype);
    if (device_buckets) {
      char host[8] = {};
      store_scalar(host, lb.dtype, status ? 1.0 : 0.0);
      device::copy(word, host, dtype_size(lb.dtype));
    } else {
      store_scalar(word, lb.dtype, status ? 1.0 : 0.0);
    }
  }
  // Partial: this rank's elements of the bucket (the status word goes apart,
  // in finish()), with the full count so every path splits the bucket as a
  // full all-reduce does and gives the same bits.
  const bool partial = !needed.empty() && !device_buckets;
  std::vector<ElementRange> mine;
  if (partial) {
    for (const BucketSlot& slot : lb.slots) {
      const ElementRange& r = needed[slot.param];
      if (!r.empty()) mine.push_back({slot.offset + r.begin, slot.offset + r.end});
    }
  }
  start_all_reduce(bucket, bucket.buffer.get(), elements, lb.dtype, op, partial ? &mine : nullptr);
  wire_bytes += elements * dtype_size(lb.dtype);
}

void GradSync::Impl::start_all_reduce(Bucket& bucket, void* data, std::size_t count, DType dtype,
                                      ReduceOp op, const std::vector<ElementRange>* needed_ranges) {
  if (!inline_comm) {
    bucket.work = needed_ranges
                      ? group.all_reduce_partial_async(data, count, dtype, op, *needed_ranges)
                      : group.all_reduce_async(data, count, dtype, op);
    return;
  }
  const auto start = Clock::now();
  if (inline_error) {
    bucket.error = inline_error;  // the group failed this iteration: no more waiting on it
  } else {
    try {
      if (needed_ranges) {
        group.all_reduce_partial(data, count, dtype, op, *needed_ranges);
      } else {
        group.all_reduce(data, count, dtype, op);
      }
    } catch (...) {
      bucket.error = inline_error = std::current_exception();
    }
  }
  bucket.done = true;
  bucket.done_at = Clock::now();
  inline_ms += detail::ms(bucket.done_at - start);
}

}  // namespace ddp
