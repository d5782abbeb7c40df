// GradAverager's own calls: what GradSync and SharedGradSum do alike, on
// their common state (grad_sync/state.h).

#include "ddp/grad_averager.h"

#include "ddp/common/error.h"
#include "ddp/log.h"
#include "grad/grad_sync/state.h"

namespace ddp {

GradAverager::GradAverager(std::unique_ptr<detail::AveragerState> state)
    : state_(std::move(state)) {}
GradAverager::~GradAverager() = default;

ProcessGroup& GradAverager::group() const { return state_->group; }
std::size_t GradAverager::num_params() const { return state_->params.size(); }
const GradParam& GradAverager::param(std::size_t index) const { return state_->params.at(index); }
std::size_t GradAverager::index_of(std::string_view name) const {
  return state_->params.index_of(name);
}
const GradSyncOptions& GradAverager::options() const { return state_->options; }

void GradAverager::prepare(const std::vector<void*>& param_data,
                           const std::vector<ParamBuffer>& buffers) {
  state_->require_between("prepare");
  state_->params.broadcast_values(state_->group, state_->options.broadcast_chunk_bytes, param_data,
                                  buffers);
}

float* GradAverager::grad_view(std::size_t index) {
  state_->params.checked_trainable(index, "grad_view");
  state_->params.require_float32(index);
  return static_cast<float*>(grad(index));
}

void GradAverager::begin_backward() {
  const auto now = detail::Clock::now();
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->iteration.begin(now);
}

void GradAverager::begin_no_sync() {
  std::lock_guard<std::mutex> lock(state_->mu);
  ++state_->iteration.no_sync_depth;
}

void GradAverager::end_no_sync() noexcept {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->iteration.no_sync_depth > 0) --state_->iteration.no_sync_depth;
}

bool GradAverager::sync_enabled() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->iteration.no_sync_depth == 0;
}

void GradAverager::set_needed_gradients(std::vector<ElementRange> per_param) {
  state_->require_between("set_needed_gradients");
  state_->params.check_needed(per_param);
  use_needed(std::move(per_param));
}

GradSyncStats GradAverager::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats.snapshot();
}

ProcessGroup& detail::non_null(const std::shared_ptr<ProcessGroup>& group, const char* who) {
  if (group == nullptr) throw Error(std::string(who) + ": the process group is null");
  return *group;
}

bool detail::AveragerState::log_synced(const IterationStats& s) const {
  if (group.rank() != 0 || !StatsBook::due(s, options.log_every)) return false;
  if (s.synced) return true;
  log::info("{} iteration {} (no_sync): backward {:.2f} ms, no communication", params.owner(),
            s.iteration, s.backward_compute_ms);
  return false;
}

}  // namespace ddp
