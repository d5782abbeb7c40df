// SharedGradSum: the public class over the shared-sum protocol of
// shared_sum.{h,cc} (blocks, rounds, double buffering), with the common
// checks, iteration bookkeeping and statistics of grad_sync/. Also
// make_grad_averager().

#include "ddp/shared_grad_sum.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ddp/common/error.h"
#include "ddp/grad_sync.h"
#include "ddp/log.h"
#include "grad/grad_sync/setup.h"
#include "grad/grad_sync/state.h"
#include "grad/shared_sum.h"
#include "kernels/reduce_kernels.h"

namespace ddp {

namespace {

constexpr const char* kWho = "SharedGradSum";

std::string mib(std::size_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
}

GradSyncOptions as_shared(GradSyncOptions options) {
  options.comm_mode = CommMode::kShared;
  return options;
}

}  // namespace

// The common state (group, parameters, options, iteration, stats, mu) is
// the base's.
struct SharedGradSum::Impl : detail::AveragerState {
  using Clock = detail::Clock;

  Impl(std::shared_ptr<ProcessGroup> owned, ProcessGroup& group, std::vector<GradParam> params,
       GradSyncOptions options);
  void contribute(std::size_t index, const std::function<void(const GradBlock&)>& write);
  void contribute_copy(std::size_t index, const void* src, const char* what);
  void finish();
  void record_iteration_locked(bool synced, Clock::time_point enter, Clock::time_point done);
  void log_iteration(const IterationStats& s) const;

  std::shared_ptr<void> memory;  // the node's sum
  std::unique_ptr<detail::SharedSum> sum;

  // Under mu:
  std::uint64_t window_round = 0;  // the round (iteration index) the current window began at
  double wait_ms = 0;              // this iteration's waits for blocks other ranks held
  std::string broken;              // a wait failed: the sums are lost from then on
};

SharedGradSum::Impl::Impl(std::shared_ptr<ProcessGroup> owned, ProcessGroup& g,
                          std::vector<GradParam> list, GradSyncOptions o)
    : AveragerState(kWho, std::move(owned), g, std::move(list), as_shared(o)) {
  detail::agree_on_setup(group, params.all(), options,
                         detail::check_setup(group, params.all(), options), kWho);
  std::vector<detail::SumParam> sp;
  for (const auto& p : params.all()) {
    const std::int64_t rows = p.shape.empty() ? 1 : std::max<std::int64_t>(p.shape[0], 1);
    sp.push_back({p.count(), dtype_size(p.dtype), rows, p.requires_grad});
  }
  const int world = group.size();
  detail::SumLayout layout = detail::make_sum_layout(sp, world, options.shared_block_bytes);
  const std::size_t bytes = detail::SharedSum::bytes_needed(layout, world);
  if (world == 1) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    memory = std::shared_ptr<void>(std::aligned_alloc(64, std::max<std::size_t>(rounded, 64)),
                                   std::free);
    if (!memory)
      throw Error("SharedGradSum: could not allocate " + mib(bytes) + " for the shared sum");
    std::memset(memory.get(), 0, bytes);
  } else {
    memory = group.allocate_node_shared(bytes);  // collective; nullptr on every rank alike
    if (!memory) {
      throw Error("SharedGradSum: needs " + mib(bytes) +
                  " of memory that every rank maps: the ranks of one node under the shm backend, "
                  "with room in its segment (DDP_SHM_ARENA_MB); this group (backend " +
                  group.backend_name() + ", " + std::to_string(world) +
                  " ranks) has none (use GradSync: comm_mode overlap or inline)");
    }
  }
  sum = std::make_unique<detail::SharedSum>(
      std::move(layout), memory.get(), group.rank(), world, group.timeout(),
      shm::WaitPolicy::for_ranks(world), [this](std::size_t p) {
        return "'" + params[p].name + "' (index " + std::to_string(p) + ")";
      });
  if (group.rank() == 0) {
    log::info(
        "SharedGradSum: {} parameters in a shared sum of {} ({} blocks of rows), {} ranks: "
        "no collectives, the ranks add their gradients into one node-shared buffer",
        params.size(), mib(sum->layout().buffer_bytes), sum->layout().blocks.size(), world);
  }
}

SharedGradSum::SharedGradSum(std::shared_ptr<ProcessGroup> group, std::vector<GradParam> params,
                             GradSyncOptions options)
    : GradAverager(std::make_unique<Impl>(group, detail::non_null(group, kWho), std::move(params),
                                          options)) {}

SharedGradSum::SharedGradSum(ProcessGroup& group, std::vector<GradParam> params,
                             GradSyncOptions options)
    : GradAverager(std::make_unique<Impl>(nullptr, group, std::move(params), options)) {}

SharedGradSum::~SharedGradSum() = default;

SharedGradSum::Impl& SharedGradSum::impl() const { return static_cast<Impl&>(state()); }

void* SharedGradSum::grad(std::size_t index) {
  impl().params.checked_trainable(index, "grad");
  // The last synced window's sum (window synced_iterations - 1; the same
  // buffer parity as synced_iterations + 1, which reads zeros before any).
  std::uint64_t synced = 0;
  {
    std::lock_guard<std::mutex> lock(impl().mu);
    synced = impl().stats.synced_iterations();
  }
  return impl().sum->result(index, synced + 1);
}

void SharedGradSum::set_grad(std::size_t index, const void* src) {
  impl().params.checked_trainable(index, "set_grad");
  impl().contribute_copy(index, src, "set_grad");
}

void SharedGradSum::add_grad(std::size_t index, const void* src) {
  impl().params.checked_trainable(index, "add_grad");
  impl().contribute_copy(index, src, "add_grad");
}

void SharedGradSum::zero_grad() { impl().require_between("zero_grad"); }

void SharedGradSum::contribute(std::size_t index,
                               const std::function<void(const GradBlock&)>& write) {
  impl().params.checked_trainable(index, "contribute");
  impl().contribute(index, write);
}

void SharedGradSum::finish() { impl().finish(); }

// ------------------------------------------------------------ hand-over and finish

void SharedGradSum::Impl::contribute(std::size_t index,
                                     const std::function<void(const GradBlock&)>& write) {
  std::uint64_t window = 0, round = 0;
  {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    if (!broken.empty()) throw Error("SharedGradSum: contribute: " + broken);
    iteration.begin(now);
    iteration.mark_once(params, index, stats.iterations() + 1, "contribute", "handed over");
    window = stats.synced_iterations();
    round = window_round;
  }
  const GradParam& p = params[index];
  const std::size_t row_elements = sum->layout().row_bytes[index] / dtype_size(p.dtype);
  const float scale = 1.0f / static_cast<float>(group.size());
  double waited = 0;
  try {
    waited = sum->contribute(index, window, round, [&](const detail::BlockWrite& b) {
      write(GradBlock{b.data, b.row_begin, b.rows, row_elements, !b.first, scale});
    });
  } catch (const detail::SharedSumTimeout& e) {
    std::lock_guard<std::mutex> lock(mu);
    broken = e.what();
    throw;
  }
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu);
  wait_ms += waited;
  iteration.note_mark(now);
}

void SharedGradSum::Impl::contribute_copy(std::size_t index, const void* src, const char* what) {
  const GradParam& p = params[index];
  if (src == nullptr && p.count() > 0) {
    throw Error(std::string("SharedGradSum: ") + what + ": source of parameter '" + p.name +
                "' is null");
  }
  const std::size_t element = dtype_size(p.dtype);
  contribute(index, [&](const GradBlock& b) {
    const std::size_t first = static_cast<std::size_t>(b.row_begin) * b.row_elements;
    copy_scaled(b.data, static_cast<const char*>(src) + first * element,
                static_cast<std::size_t>(b.rows) * b.row_elements, p.dtype, b.scale, b.accumulate);
  });
}

void SharedGradSum::Impl::finish() {
  const auto enter = Clock::now();
  std::unique_lock<std::mutex> lock(mu);
  iteration.begin(enter);
  if (!broken.empty()) {
    record_iteration_locked(false, enter, enter);
    throw Error("SharedGradSum: finish: " + broken);
  }
  const bool sync = iteration.sync;
  const std::uint64_t window = stats.synced_iterations(), round = stats.iterations();
  // Parameters not handed over count as zero contributions, so that no rank
  // waits for them; without find_unused_parameters they void the window.
  const std::vector<std::size_t> unmarked = params.unmarked(iteration.marked);
  try {
    for (std::size_t p : unmarked) {
      if (sync && !options.find_unused_parameters) sum->flag_missing(p, window);
      const std::size_t row_bytes = sum->layout().row_bytes[p];
      wait_ms += sum->contribute(p, window, window_round, [&](const detail::BlockWrite& b) {
        if (b.first) std::memset(b.data, 0, static_cast<std::size_t>(b.rows) * row_bytes);
      });
    }
    sum->publish_rounds(round + 1);
    if (sync) sum->wait_rounds(round + 1);  // its time is inside finish()'s, which counts
  } catch (const detail::SharedSumTimeout& e) {
    broken = e.what();
    record_iteration_locked(sync, enter, Clock::now());
    throw;
  }
  std::vector<std::size_t> invalid;
  if (sync) {
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (params[p].requires_grad && sum->missing(p, window)) invalid.push_back(p);
    }
  }
  record_iteration_locked(sync, enter, Clock::now());
  if (sync) window_round = stats.iterations();  // the next window begins with the next round
  const std::uint64_t number = stats.iterations();
  lock.unlock();
  log_iteration(stats.last());
  if (invalid.empty()) return;
  if (!options.find_unused_parameters && !unmarked.empty()) {
    throw Error("SharedGradSum: iteration " + std::to_string(number) +
                ": parameters never handed over on rank " + std::to_string(group.rank()) + ": " +
                params.names(unmarked) +
                "; contribute every parameter that has a gradient, or set find_unused_parameters "
                "to count them as zero (every rank's gradients of this iteration are invalid)");
  }
  throw Error("SharedGradSum: iteration " + std::to_string(number) + ": " + params.names(invalid) +
              " had no valid gradient from some rank (never handed over there, or its write "
              "failed; that rank's error names it): every rank's gradients of this iteration are "
              "invalid");
}

void SharedGradSum::Impl::record_iteration_locked(bool synced, Clock::time_point enter,
                                                  Clock::time_point done) {
  // Waits for blocks other ranks held: not compute, and nothing hides them.
  Clock::time_point end;
  IterationStats s = figures_locked(synced, enter, wait_ms, &end);
  if (synced) {
    s.exposed_comm_ms = detail::ms(done - enter) + wait_ms;
    s.comm_ms = s.exposed_comm_ms;  // no collective: its communication is its waiting
  }
  record_locked(s);
  wait_ms = 0;
}

void SharedGradSum::Impl::log_iteration(const IterationStats& s) const {
  if (!log_synced(s)) return;
  log::info(
      "SharedGradSum iteration {}: backward {:.2f} ms (the sum made inside it), waiting "
      "for other ranks {:.2f} ms (no collectives)",
      s.iteration, s.backward_compute_ms, s.exposed_comm_ms);
}

// ------------------------------------------------------------ make_grad_averager

std::unique_ptr<GradAverager> make_grad_averager(std::shared_ptr<ProcessGroup> group,
                                                 std::vector<GradParam> params,
                                                 GradSyncOptions options) {
  if (options.comm_mode == CommMode::kShared) {
    return std::make_unique<SharedGradSum>(std::move(group), std::move(params), options);
  }
  return std::make_unique<GradSync>(std::move(group), std::move(params), options);
}

std::unique_ptr<GradAverager> make_grad_averager(ProcessGroup& group, std::vector<GradParam> params,
                                                 GradSyncOptions options) {
  if (options.comm_mode == CommMode::kShared) {
    return std::make_unique<SharedGradSum>(group, std::move(params), options);
  }
  return std::make_unique<GradSync>(group, std::move(params), options);
}

}  // namespace ddp
