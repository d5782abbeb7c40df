// GradSync's public calls, construction, views, the copy-in path and layout
// changes. Bucket memory and launching: grad_sync/buckets.cc; completion,
// finish() and statistics: grad_sync/completion.cc; checks and agreement
// across ranks: grad_sync/setup.cc.

#include "ddp/grad_sync.h"

#include <algorithm>
#include <cstring>

#include "ddp/common/error.h"
#include "ddp/log.h"
#include "device/device_memory.h"
#include "grad/grad_sync/bucket_packing.h"
#include "grad/grad_sync/impl.h"
#include "grad/grad_sync/setup.h"
#include "helpers/helpers_internal.h"
#include "kernels/reduce_kernels.h"

namespace ddp {

namespace {

constexpr const char* kWho = "GradSync";

std::string mib(std::size_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::vector<LayoutParam> layout_params(const detail::ParamList& params) {
  std::vector<LayoutParam> lp;
  for (const auto& p : params.all()) lp.push_back({p.count(), p.dtype, p.device});
  return lp;
}

}  // namespace

const char* comm_mode_name(CommMode mode) {
  switch (mode) {
    case CommMode::kOverlap:
      return "overlap";
    case CommMode::kInline:
      return "inline";
    case CommMode::kShared:
      return "shared";
  }
  return "?";
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kFp16:
      return "fp16";
    case Compression::kBf16:
      return "bf16";
  }
  return "unknown";
}

// ------------------------------------------------------------ construction

GradSync::Impl::Impl(std::shared_ptr<ProcessGroup> owned, ProcessGroup& g,
                     std::vector<GradParam> list, GradSyncOptions o)
    : AveragerState(kWho, std::move(owned), g, std::move(list), o) {
  std::string problem = detail::check_setup(group, params.all(), options);
  if (problem.empty() && options.comm_mode == CommMode::kShared) {
    problem =
        "comm_mode shared is ddp::SharedGradSum (shared_grad_sum.h), not a GradSync mode; "
        "make_grad_averager() picks the class from comm_mode";
  }
  detail::agree_on_setup(group, params.all(), options, problem, kWho);

  const std::size_t n = params.size();
  std::vector<bool> trainable(n);
  for (std::size_t i = 0; i < n; ++i) {
    trainable[i] = params[i].requires_grad;
    device_buckets = device_buckets || (params[i].requires_grad && params[i].device >= 0);
  }
  scaled.assign(n, options.prescaled_grads ? 1 : 0);
  known_zero.assign(n, 1);
  record_order = options.rebuild_buckets;
  inline_comm = options.comm_mode == CommMode::kInline;

  apply_layout(make_bucket_layout(layout_params(params), reverse_registration_order(trainable),
                                  options.first_bucket_bytes, options.bucket_cap_bytes),
               false);
  if (group.rank() == 0) {
    std::size_t elements = 0;
    for (const auto& p : params.all()) elements += p.requires_grad ? p.count() : 0;
    log::info(
        "GradSync: {} parameters ({} gradient elements, {}) in {}; first bucket {}, cap {}, "
        "compression {}, backend {}, {} ranks, communication {}",
        n, elements, mib(layout.total_bytes()), describe_layout(layout),
        mib(options.first_bucket_bytes), mib(options.bucket_cap_bytes),
        compression_name(options.compression), group.backend_name(), group.size(),
        inline_comm ? "inline (on the caller's thread)" : "overlapped (on the group's thread)");
  }
}

GradSync::GradSync(std::shared_ptr<ProcessGroup> group, std::vector<GradParam> params,
                   GradSyncOptions options)
    : GradAverager(std::make_unique<Impl>(group, detail::non_null(group, kWho), std::move(params),
                                          options)) {}

GradSync::GradSync(ProcessGroup& group, std::vector<GradParam> params, GradSyncOptions options)
    : GradAverager(std::make_unique<Impl>(nullptr, group, std::move(params), options)) {}

GradSync::Impl& GradSync::impl() const { return static_cast<Impl&>(state()); }

GradSync::~GradSync() {
  for (auto& b : impl().buckets) {
    if (!b->work) continue;
    try {
      b->work->wait();
    } catch (...) {
      // The collective's error was (or will never be) reported by finish().
    }
  }
}

// ------------------------------------------------------------ parameters and views

const BucketLayout& GradSync::layout() const { return impl().layout; }
int GradSync::layout_version() const { return impl().layout_version; }

void* GradSync::Impl::view(std::size_t index) const {
  const BucketSlot& slot = layout.slot(index);
  return buckets[layout.bucket_of[index]]->data() + slot.offset * dtype_size(params[index].dtype);
}

void GradSync::Impl::zero_if_unwritten(std::size_t index) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!unwritten[index]) return;
    unwritten[index] = 0;
    known_zero[index] = 1;
  }
  zero_bytes(view(index), params[index].count() * dtype_size(params[index].dtype));
}

void* GradSync::grad(std::size_t index) {
  impl().params.checked_trainable(index, "grad");
  impl().zero_if_unwritten(index);
  return impl().view(index);
}

void GradSync::Impl::zero_bytes(void* p, std::size_t bytes) const {
  if (device_buckets) {
    device::zero(p, bytes);
  } else {
    std::memset(p, 0, bytes);
  }
}

// ------------------------------------------------------------ between iterations

void GradSync::use_needed(std::vector<ElementRange> per_param) {
  std::lock_guard<std::mutex> lock(impl().mu);
  impl().needed = std::move(per_param);
}

bool GradSync::partial() const {
  std::lock_guard<std::mutex> lock(impl().mu);
  return !impl().needed.empty();
}

void GradSync::zero_grad() {
  impl().require_between("zero_grad");
  for (std::size_t b = 0; b < impl().buckets.size(); ++b) {
    impl().zero_bytes(impl().buckets[b]->data(), impl().layout.buckets[b].bytes());
  }
  std::lock_guard<std::mutex> lock(impl().mu);
  std::fill(impl().known_zero.begin(), impl().known_zero.end(), 1);
  std::fill(impl().unwritten.begin(), impl().unwritten.end(), 0);
}

void GradSync::set_first_bucket_bytes(std::size_t bytes) {
  impl().require_between("set_first_bucket_bytes");
  if (bytes == 0) throw Error("GradSync: set_first_bucket_bytes: bytes must be > 0");
  impl().options.first_bucket_bytes = bytes;
  impl().relayout(make_bucket_layout(layout_params(impl().params), impl().layout.order, bytes,
                                     impl().options.bucket_cap_bytes));
}

void GradSync::Impl::relayout(BucketLayout fresh) {
  if (fresh == layout) return;
  apply_layout(std::move(fresh), true);
  ++layout_version;
}

void GradSync::Impl::maybe_rebuild() {
  if (rebuilt || !options.rebuild_buckets) return;
  rebuilt = true;
  std::vector<std::size_t> observed;
  {
    std::lock_guard<std::mutex> lock(mu);
    record_order = false;
    observed.swap(observed_order);
  }
  // Rank 0's order, so every rank builds the same layout.
  std::string bytes;
  if (group.rank() == 0) {
    detail::Encoder e;
    e.i64(static_cast<std::int64_t>(observed.size()));
    for (auto p : observed) e.i64(static_cast<std::int64_t>(p));
    bytes = e.bytes();
  }
  if (group.size() > 1) group.broadcast_object(bytes, 0);
  detail::Decoder d(bytes, "GradSync rebuild");
  std::vector<std::size_t> order0(static_cast<std::size_t>(d.i64()));
  for (auto& p : order0) p = static_cast<std::size_t>(d.i64());

  BucketLayout fresh =
      make_bucket_layout(layout_params(params), rebuild_order(order0, layout.order),
                         options.first_bucket_bytes, options.bucket_cap_bytes);
  if (fresh == layout) {
    if (group.rank() == 0) log::debug("GradSync: the observed gradient order keeps the layout");
    return;
  }
  relayout(std::move(fresh));
  if (group.rank() == 0) {
    log::info("GradSync: buckets rebuilt from rank 0's gradient order: {}",
              describe_layout(layout));
  }
}

// ------------------------------------------------------------ iterations

void GradSync::set_grad(std::size_t index, const void* src) { impl().copy_in(index, src, false); }
void GradSync::add_grad(std::size_t index, const void* src) { impl().copy_in(index, src, true); }

void GradSync::Impl::copy_in(std::size_t index, const void* src, bool accumulate) {
  const char* what = accumulate ? "add_grad" : "set_grad";
  params.checked_trainable(index, what);
  const GradParam& p = params[index];
  const std::size_t count = p.count();
  if (src == nullptr && count > 0) {
    throw Error(std::string("GradSync: ") + what + ": source of parameter '" + p.name +
                "' is null");
  }
  if (device_buckets && accumulate) {
    throw Error("GradSync: add_grad: parameter '" + p.name +
                "' has a device bucket; accumulate into grad() with your own kernels");
  }
  const double scale = 1.0 / group.size();
  bool rescale_existing = false;
  {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    iteration.begin(now);
    if (iteration.marked[index]) {
      throw Error(std::string("GradSync: ") + what + ": parameter '" + p.name + "' (index " +
                  std::to_string(index) + ") was already marked ready in iteration " +
                  std::to_string(stats.iterations() + 1) + " (its bucket may be in flight)");
    }
    if (!device_buckets) {
      // Adding to a view never written is storing: its bytes are not zeros yet.
      accumulate = accumulate && !unwritten[index];
      unwritten[index] = 0;
      // A view holding unscaled values (a previous result, raw writes) is
      // brought to the same scale before scaled values are added to it.
      rescale_existing = accumulate && !scaled[index] && !known_zero[index] && scale != 1.0;
      scaled[index] = 1;
    }
    known_zero[index] = 0;
  }
  void* dst = view(index);
  if (device_buckets) {
    device::copy(dst, src, count * dtype_size(p.dtype));
    return;
  }
  if (rescale_existing) scale_in_place(dst, count, p.dtype, scale);
  copy_scaled(dst, src, count, p.dtype, scale, accumulate);
}

void GradSync::mark_ready(std::size_t index) {
  Impl& m = impl();
  m.params.checked_trainable(index, "mark_ready");
  m.zero_if_unwritten(index);  // marked without a write: its gradient is zero
  const auto now = detail::Clock::now();
  std::lock_guard<std::mutex> lock(m.mu);
  m.iteration.begin(now);
  m.iteration.mark_once(m.params, index, m.stats.iterations() + 1, "mark_ready", "marked ready");
  m.known_zero[index] = 0;
  if (m.record_order) m.observed_order.push_back(index);
  m.iteration.note_mark(now);
  if (!m.iteration.sync) return;
  detail::Bucket& bucket = *m.buckets[m.layout.bucket_of[index]];
  if (--bucket.pending == 0) m.launch_ready_locked(false);
  m.poll_completions_locked(now);
}

void GradSync::contribute(std::size_t index, const std::function<void(const GradBlock&)>& write) {
  Impl& m = impl();
  m.params.checked_trainable(index, "contribute");
  const GradParam& p = m.params[index];
  GradBlock block;
  block.data = m.view(index);
  block.rows = p.shape.empty() ? 1 : p.shape[0];
  block.row_elements = block.rows > 0 ? p.count() / static_cast<std::size_t>(block.rows) : 0;
  block.scale = m.device_buckets && !m.options.prescaled_grads ? 1.0f : grad_scale();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.iteration.begin(detail::Clock::now());
    if (m.iteration.marked[index]) {
      throw Error("GradSync: contribute: parameter '" + p.name + "' (index " +
                  std::to_string(index) + ") was already marked ready in iteration " +
                  std::to_string(m.stats.iterations() + 1) + " (its bucket may be in flight)");
    }
    // Stores first in an accumulation window; adds in its later no_sync iterations.
    block.accumulate = m.iteration.marked_window[index] != 0;
    m.unwritten[index] = 0;
    if (!m.device_buckets) m.scaled[index] = 1;
    m.known_zero[index] = 0;
  }
  write(block);
  mark_ready(index);
}

void GradSync::finish() { impl().finish(); }

}  // namespace ddp
