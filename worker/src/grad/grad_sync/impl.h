#pragma once
// GradSync's private state and the functions of its parts (internal):
//   grad_sync.cc            construction, views, copy-in, layout changes;
//   grad_sync/buckets.cc    bucket memory and launching all-reduces in order;
//   grad_sync/completion.cc observing completions, finish(), statistics.
// `mu` guards the iteration state (iteration, buckets' per-iteration fields,
// timing, stats); the layout and bucket memory change only between
// iterations, on the one thread that calls finish().

#include <exception>
#include <memory>
#include <vector>

#include "ddp/bucket_layout.h"
#include "ddp/grad_sync.h"
#include "ddp/work.h"
#include "grad/grad_sync/state.h"

namespace ddp {
namespace detail {

// One bucket's memory and this iteration's state.
struct Bucket {
  std::shared_ptr<void> buffer;  // count (+1 status word) elements of the bucket's dtype
  std::shared_ptr<void> wire;    // compression: count (+1) 16-bit elements
  bool compressed = false;
  bool has_status = false;  // the last bucket carries the unused-parameter status word
  std::size_t pending = 0;  // slots not yet ready in this iteration
  bool launched = false;
  bool done = false;
  Clock::time_point done_at{};
  std::shared_ptr<Work> work;
  std::exception_ptr error;  // kInline: the collective's failure

  char* data() const { return static_cast<char*>(buffer.get()); }
  std::uint16_t* wire16() const { return static_cast<std::uint16_t*>(wire.get()); }
};

}  // namespace detail

// The common state (group, parameters, options, iteration, stats, mu) is
// the base's.
struct GradSync::Impl : detail::AveragerState {
  using Clock = detail::Clock;
  using Bucket = detail::Bucket;

  Impl(std::shared_ptr<ProcessGroup> owned, ProcessGroup& group, std::vector<GradParam> params,
       GradSyncOptions options);

  bool device_buckets = false;  // bucket memory is CUDA device memory
  bool inline_comm = false;     // collectives on the caller's thread (kInline)

  BucketLayout layout;
  int layout_version = 0;
  std::vector<std::unique_ptr<Bucket>> buckets;

  // Under mu:
  std::vector<char> scaled;      // per parameter: values carry the 1/world_size factor
  std::vector<char> known_zero;  // per parameter: the view is known to hold zeros
  // Per parameter (host buckets): the view holds what the memory held, not
  // yet zeroed; it reads zeros once zero_if_unwritten() ran or a write came.
  std::vector<char> unwritten;
  std::vector<ElementRange> needed;  // set_needed_gradients; empty: full all-reduces
  std::size_t next_launch = 0;
  std::size_t oldest_unfinished = 0;
  std::vector<std::size_t> observed_order;
  bool rebuilt = false;
  bool record_order = true;

  // This iteration's communication.
  Clock::time_point first_launch{};
  bool have_first_launch = false;
  std::size_t wire_bytes = 0, launched_count = 0;
  double inline_ms = 0, inline_finish_ms = 0;  // inline collectives: all, those in finish()
  std::exception_ptr inline_error;             // the iteration's first inline failure

  // grad_sync.cc
  void* view(std::size_t index) const;  // unchecked
  void zero_bytes(void* p, std::size_t bytes) const;
  // Zeroes the view of a parameter still `unwritten`. Takes mu.
  void zero_if_unwritten(std::size_t index);
  void copy_in(std::size_t index, const void* src, bool accumulate);
  void maybe_rebuild();
  void relayout(BucketLayout fresh);

  // buckets.cc
  // Allocates buckets for `fresh` (device ones zeroed; host parameters
  // stay `unwritten` until zeroed or written); with keep_values, copies
  // every written gradient from the current buckets. Then makes it the layout.
  void apply_layout(BucketLayout fresh, bool keep_values);
  // Launches the leading buckets whose slots are all ready, in order.
  void launch_ready_locked(bool status);

  // completion.cc
  void poll_completions_locked(Clock::time_point now);
  void finish();
  void record_iteration_locked(bool synced, Clock::time_point enter, Clock::time_point done);
  void log_iteration(const IterationStats& s) const;

 private:
  void launch_locked(std::size_t b, bool status);
  void start_all_reduce(Bucket& bucket, void* data, std::size_t count, DType dtype, ReduceOp op,
                        const std::vector<ElementRange>* needed_ranges);
  // The status words of every rank's last bucket, after the reductions.
  bool global_status_locked(bool local, std::exception_ptr& error);
  // Waits for every launched bucket; the first error goes to `error`.
  void wait_launched_locked(std::exception_ptr& error);
  // The iteration's error when some rank left parameters unmarked (this
  // rank's `unmarked`, or another's when it is empty).
  [[noreturn]] void throw_unmarked(std::uint64_t iteration_number,
                                   const std::vector<std::size_t>& unmarked) const;
};

}  // namespace ddp
