// Which variant each call of the shm backend runs: forced, read from the tune
// file, or timed by every local rank at the first call of a size class and
// agreed from one table.

#include "backends/shm/shm_backend.h"

namespace ddp::shm_backend {

Algorithm ShmBackend::algorithm_for_call(Collective c, std::size_t bytes, DType dtype,
                                         std::int32_t op, int root) {
  if (forced_.of(c) != Algorithm::kAuto) return forced_.of(c);
  if (cross_)
    return Algorithm::kPush;  // across nodes nothing is timed: push within the node, then Gloo
  const auto key = std::make_pair(c, shm::size_class(bytes));
  {
    std::lock_guard<std::mutex> lock(choices_mu_);
    if (auto it = choices_.find(key); it != choices_.end()) return it->second;
  }
  if (timing_spent_ms_ >= budget_ms_) {
    // Identical on every rank: the spent time adds up the same published timings.
    std::lock_guard<std::mutex> lock(choices_mu_);
    const Algorithm near =
        shm::nearest_choice(choices_, c, key.second, segment().geometry().small_bytes)
            .value_or(Algorithm::kChunked);
    choices_[key] = near;
    sources_[key] = Source::kNearest;
    return near;
  }
  const auto [chosen, timed] = choose_by_timing(c, bytes, dtype, op, root);
  {
    std::lock_guard<std::mutex> lock(choices_mu_);
    choices_[key] = chosen;
    sources_[key] = timed ? Source::kTimed : Source::kNoRoom;
  }
  if (timed) shm::learn_choice(choice_scope(), c, key.second, chosen);
  if (timing_spent_ms_ >= budget_ms_) {
    log::write(
        log::Level::kDebug, false,
        fmt::format(
            "shm: the timing budget of {} ms (DDP_SHM_TUNE_BUDGET_MS) is spent; size classes "
            "not timed yet take the nearest timed class's choice",
            budget_ms_));
  }
  if (timed && me_ == 0 && !tune_path_.empty()) save_tune_file();
  return chosen;
}

shm::ChoiceScope ShmBackend::choice_scope() const {
  const shm::Geometry& g = segment().geometry();
  return {config_.run_id, config_.round, local_size_, g.small_bytes, g.chunk_bytes};
}

const char* ShmBackend::source_name(Source s) {
  switch (s) {
    case Source::kTimed:
      return "timed";
    case Source::kFile:
      return "DDP_SHM_TUNE_FILE";
    case Source::kEarlier:
      return "timed by an earlier group of this run";
    case Source::kNearest:
      return "as the nearest timed class: timing budget spent";
    case Source::kNoRoom:
      return "untimed: no room for scratch";
  }
  return "?";
}

namespace {

// One debug line per timed choice: the candidates' times and the winner.
void log_timed_choice(Collective c, std::size_t bytes, int local_size, std::size_t block,
                      const std::vector<Algorithm>& candidates, const std::vector<double>& slowest,
                      Algorithm chosen, Clock::duration took) {
  std::string times;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    times += fmt::format("{}{} {:.1f} us", i ? ", " : "", shm::algorithm_name(candidates[i]),
                         slowest[i] * 1e6);
  }
  const int cls = shm::size_class(bytes);
  log::write(
      log::Level::kDebug, false,
      fmt::format("shm: {} calls {} on {} local ranks, timed at {} bytes per rank: {} (slowest "
                  "rank's best) -> {}; timing took {:.1f} ms",
                  shm::collective_name(c),
                  cls == shm::kLastClass
                      ? "over 16 MiB"
                      : "up to " + std::to_string(shm::class_limit(cls)) + " bytes",
                  local_size, block, times, shm::algorithm_name(chosen),
                  std::chrono::duration<double, std::milli>(took).count()));
}

}  // namespace

std::pair<Algorithm, bool> ShmBackend::choose_by_timing(Collective c, std::size_t bytes,
                                                        DType dtype, std::int32_t op, int root) {
  const auto started = Clock::now();
  const std::vector<Algorithm> candidates =
      shm::candidates(c, bytes, segment().geometry().small_bytes);
  const std::size_t element = dtype_size(dtype);
  const std::size_t blocks =
      c == Collective::kReduceScatter || c == Collective::kAllGather ? local_size_ : 1;
  const std::size_t count =
      std::max<std::size_t>(1, std::min(bytes, shm::kLargestTimedBytes / blocks) / element);
  const std::size_t block = count * element;
  // reduce_scatter's output follows its input.
  const std::size_t scratch_bytes = block * (blocks + (c == Collective::kReduceScatter ? 1 : 0));
  std::string why;
  const std::optional<std::size_t> scratch = take_pages(scratch_bytes, &why, true);
  const std::int64_t at =
      scratch ? static_cast<std::int64_t>(segment().arena_offset(me_) + *scratch) : -1;
  struct Release {
    ShmBackend* self;
    std::optional<std::size_t> offset;
    std::size_t bytes;
    ~Release() {
      if (offset) self->give_pages_back(*offset, bytes);
    }
  } release{this, scratch, scratch_bytes};
  Descriptor announce = descriptor(kind_of(c), dtype, block, root, op, Algorithm::kAuto, true);
  announce.offset = at;
  begin(announce);
  if (!all_in_segment()) {
    log::write(log::Level::kDebug, false,
               std::string("shm: no room to time ") + shm::collective_name(c) + " (" +
                   (scratch ? "another rank's arena" : why) + "); it runs through the chunk slots");
    return {Algorithm::kChunked, false};
  }
  char* p = segment().base() + at;
  const std::size_t total = block * blocks;
  // Fewer runs where each takes longer (a 16 MiB push here: about 3 ms); noise matters less there.
  const int reps = total <= (256u << 10) ? 8
                   : total <= (2u << 20) ? 4
                   : total <= (8u << 20) ? 2
                                         : 1;
  double* mine = segment().control(me_).timings;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r <= reps; ++r) {  // the first run warms up
      const auto start = Clock::now();
      run_variant(c, candidates[i], p, count, dtype, op, root);
      if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    mine[i] = best;
  }
  sync_->phase(deadline_);  // every rank's times are published
  std::vector<std::vector<double>> seconds(local_size_, std::vector<double>(candidates.size()));
  for (int k = 0; k < local_size_; ++k) {
    for (std::size_t i = 0; i < candidates.size(); ++i)
      seconds[k][i] = segment().control(k).timings[i];
  }
  std::vector<double> slowest;
  const Algorithm chosen = candidates[shm::choose(seconds, &slowest)];
  // The slowest rank's runs: the same sum on every rank.
  for (double t : slowest) timing_spent_ms_ += t * (reps + 1) * 1e3;
  if (log::enabled(log::Level::kDebug)) {
    log_timed_choice(c, bytes, local_size_, block, candidates, slowest, chosen,
                     Clock::now() - started);
  }
  return {chosen, true};
}

void ShmBackend::run_variant(Collective c, Algorithm a, char* p, std::size_t count, DType dtype,
                             std::int32_t op, int root) {
  const std::size_t block = count * dtype_size(dtype);
  const auto reduce_op = static_cast<ReduceOp>(std::max(op, 0));
  switch (c) {
    case Collective::kAllReduce:
      return run_all_reduce(a, p, count, dtype, reduce_op, nullptr, true);
    case Collective::kReduceScatter:
      return run_reduce_scatter(a, p, p + block * static_cast<std::size_t>(local_size_), count,
                                dtype, reduce_op, true);
    case Collective::kAllGather:
      return run_all_gather(a, p + block * static_cast<std::size_t>(me_), p, count, dtype, true);
    case Collective::kBroadcast:
      return run_broadcast(a, p, count, dtype, root, true);
  }
}

void ShmBackend::save_tune_file() {
  shm::ChoiceTable known;
  {
    std::lock_guard<std::mutex> lock(choices_mu_);
    for (const auto& [key, source] : sources_) {
      if (source != Source::kNearest && source != Source::kNoRoom) known[key] = choices_.at(key);
    }
  }
  static const std::string model = shm::cpu_model();  // read once per process
  const std::string why = shm::write_tune_file(
      tune_path_, shm::format_tune_file(shm::merged(tune_entries_, local_size_, known),
                                        model.empty() ? "" : "timed on " + model));
  if (!why.empty() && !tune_warned_) {
    tune_warned_ = true;
    log::write(log::Level::kWarn, true,
               "shm: could not save the algorithm choices to DDP_SHM_TUNE_FILE: " + why);
  }
}

}  // namespace ddp::shm_backend
