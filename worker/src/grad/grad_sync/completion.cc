// GradSync's completion side: observing finished buckets (at mark_ready
// calls and in finish()), finish() itself (unused parameters, waiting in
// launch order, widening compressed buckets, the status word that tells every
// rank whether some rank missed a parameter), and the iteration's statistics.

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/log.h"
#include "device/device_memory.h"
#include "grad/grad_sync/impl.h"
#include "kernels/reduce_kernels.h"

namespace ddp {

void GradSync::Impl::poll_completions_locked(Clock::time_point now) {
  while (oldest_unfinished < next_launch) {
    Bucket& bucket = *buckets[oldest_unfinished];
    if (!bucket.done) {
      if (bucket.work && !bucket.work->is_completed()) return;
      bucket.done = true;
      bucket.done_at = now;
    }
    ++oldest_unfinished;
  }
}

void GradSync::Impl::finish() {
  const auto enter = Clock::now();
  std::unique_lock<std::mutex> lock(mu);
  iteration.begin(enter);
  poll_completions_locked(enter);
  if (!iteration.sync) {
    record_iteration_locked(false, enter, enter);
    lock.unlock();
    maybe_rebuild();
    log_iteration(stats.last());
    return;
  }

  // Parameters never marked ready: zeros (unless accumulated in an earlier
  // no_sync step), so every bucket can still be reduced and no rank hangs.
  const std::vector<std::size_t> unmarked = params.unmarked(iteration.marked);
  for (std::size_t p : unmarked) {
    if (!iteration.marked_window[p]) {
      zero_bytes(view(p), params[p].count() * dtype_size(params[p].dtype));
      known_zero[p] = 1;
      unwritten[p] = 0;
    }
    --buckets[layout.bucket_of[p]]->pending;
  }
  const bool local_status = !unmarked.empty() && !options.find_unused_parameters;
  std::exception_ptr error;
  const double inline_before = inline_ms;
  try {
    launch_ready_locked(local_status);
  } catch (...) {
    error = std::current_exception();
  }
  inline_finish_ms = inline_ms - inline_before;

  wait_launched_locked(error);
  const bool global_status = global_status_locked(local_status, error);
  record_iteration_locked(true, enter, Clock::now());
  const std::uint64_t number = stats.iterations();
  std::fill(known_zero.begin(), known_zero.end(), 0);
  lock.unlock();

  if (error) {
    log_iteration(stats.last());
    std::rethrow_exception(error);
  }
  if (global_status && !options.find_unused_parameters) {
    {
      std::lock_guard<std::mutex> relock(mu);
      observed_order.clear();  // an incomplete iteration's order is no basis for a rebuild
    }
    throw_unmarked(number, unmarked);
  }
  maybe_rebuild();
  log_iteration(stats.last());
}

void GradSync::Impl::wait_launched_locked(std::exception_ptr& error) {
  // In launch order; a 16-bit bucket is unpacked while later ones are still in flight.
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = *buckets[b];
    if (!bucket.launched) continue;
    try {
      if (bucket.error) std::rethrow_exception(bucket.error);
      if (bucket.work) bucket.work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    if (!bucket.done) {
      bucket.done = true;
      bucket.done_at = Clock::now();
    }
    if (!error && bucket.compressed) {
      const LayoutBucket& lb = layout.buckets[b];
      decompress_from_16(bucket.wire16(), bucket.data(), lb.dtype, lb.count,
                         options.compression == Compression::kFp16);
    }
  }
}

void GradSync::Impl::throw_unmarked(std::uint64_t iteration_number,
                                    const std::vector<std::size_t>& unmarked) const {
  if (!unmarked.empty()) {
    throw Error("GradSync: iteration " + std::to_string(iteration_number) +
                ": parameters never marked ready on rank " + std::to_string(group.rank()) + ": " +
                params.names(unmarked) +
                "; mark every parameter that has a gradient, or set find_unused_parameters to "
                "count them as zero (every rank's gradients of this iteration are invalid)");
  }
  throw Error("GradSync: iteration " + std::to_string(iteration_number) +
              ": another rank had parameters that were never marked ready (its error names "
              "them); this rank marked all of them, but the iteration's gradients are invalid");
}

bool GradSync::Impl::global_status_locked(bool local, std::exception_ptr& error) {
  if (error || group.size() == 1 || buckets.empty()) return local;
  const Bucket& last = *buckets.back();
  const LayoutBucket& lb = layout.buckets.back();
  if (!needed.empty() && !device_buckets && !last.compressed) {
    // Partial reductions leave the bucket's status word unreduced: one word of its own.
    double flag = local ? 1.0 : 0.0;
    try {
      group.all_reduce(&flag, 1, DType::kFloat64, ReduceOp::kMax);
    } catch (...) {
      error = std::current_exception();
      return local;
    }
    return flag != 0;
  }
  if (last.compressed) {
    const DType wire =
        options.compression == Compression::kFp16 ? DType::kFloat16 : DType::kBFloat16;
    return load_scalar(last.wire16() + lb.count, wire) != 0;
  }
  const char* word = last.data() + lb.count * dtype_size(lb.dtype);
  if (!device_buckets) return load_scalar(word, lb.dtype) != 0;
  char host[8] = {};
  try {
    device::copy(host, word, dtype_size(lb.dtype));
  } catch (...) {
    error = std::current_exception();
  }
  return load_scalar(host, lb.dtype) != 0;
}

void GradSync::Impl::record_iteration_locked(bool synced, Clock::time_point enter,
                                             Clock::time_point done) {
  // Inline collectives run inside mark_ready calls: communication nothing
  // hides, not compute, and exposed as well as whatever finish() waited for.
  const double in_backward = inline_ms - inline_finish_ms;
  Clock::time_point end;
  IterationStats s = figures_locked(synced, enter, in_backward, &end);
  if (synced) {
    s.exposed_comm_ms = detail::ms(done - enter) + in_backward;
    s.inline_comm_ms = inline_ms;
    s.buckets = launched_count;
    s.bytes_on_wire = wire_bytes;
    if (have_first_launch) {
      Clock::time_point comm_end = first_launch;
      for (const auto& b : buckets) {
        if (b->launched && b->done) comm_end = std::max(comm_end, b->done_at);
      }
      s.comm_ms = detail::ms(comm_end - first_launch);
      // Inline collectives run between the backward's layers, never beside them.
      s.overlap_ms =
          inline_comm ? 0.0 : std::max(0.0, detail::ms(std::min(end, comm_end) - first_launch));
    }
    // The accumulation window ends with the synced iteration.
    std::fill(scaled.begin(), scaled.end(), options.prescaled_grads ? 1 : 0);
  }
  record_locked(s);

  // Reset for the next iteration.
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = *buckets[b];
    bucket.pending = layout.buckets[b].slots.size();
    bucket.launched = false;
    bucket.done = false;
    bucket.work.reset();
    bucket.error = nullptr;
  }
  inline_error = nullptr;
  inline_ms = inline_finish_ms = 0;
  next_launch = 0;
  oldest_unfinished = 0;
  have_first_launch = false;
  wire_bytes = 0;
  launched_count = 0;
}

void GradSync::Impl::log_iteration(const IterationStats& s) const {
  if (!log_synced(s)) return;
  log::info(
      "GradSync iteration {}: backward {:.2f} ms, communication {:.2f} ms, overlap {:.2f} ms, "
      "exposed {:.2f} ms{} ({} buckets, {:.2f} MB)",
      s.iteration, s.backward_compute_ms, s.comm_ms, s.overlap_ms, s.exposed_comm_ms,
      inline_comm ? fmt::format(", inline {:.2f} ms", s.inline_comm_ms) : std::string(), s.buckets,
      static_cast<double>(s.bytes_on_wire) / 1e6);
}

}  // namespace ddp
