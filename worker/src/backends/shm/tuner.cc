// Which variant each call of the shm backend runs: forced, read from the tune
// file, or timed by every local rank at the first call of a size class and
// agreed from one table.

#include "backends/shm/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "backends/shm/tune_file.h"
#include "ddp/log.h"

namespace ddp::shm {

std::string Tuner::read_tune_file() {
  const char* path = std::getenv("DDP_SHM_TUNE_FILE");
  if (path == nullptr || *path == 0) return "";
  tune_path_ = path;
  std::string text = shm::read_tune_file(tune_path_);
  tune_entries_ = parse_tune_file(text, tune_path_);
  return text;
}

void Tuner::start(const ChoiceScope& scope, int me, const std::vector<PackedChoices>& learned,
                  const std::string& tune_text) {
  scope_ = scope;
  me_ = me;
  std::lock_guard<std::mutex> lock(mu_);
  choices_ = agreed(learned);
  for (const auto& entry : choices_) sources_[entry.first] = Source::kEarlier;
  const ChoiceTable from_file = table_for(
      me == 0 ? tune_entries_ : parse_tune_file(tune_text, "of local rank 0 (DDP_SHM_TUNE_FILE)"),
      scope.local_size);
  for (const auto& [key, algorithm] : from_file) {
    choices_[key] = algorithm;
    sources_[key] = Source::kFile;
  }
}

std::string Tuner::describe(Collective c, std::size_t bytes) const {
  if (forced_.of(c) != Algorithm::kAuto)
    return std::string(algorithm_name(forced_.of(c))) + " (forced)";
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(c, size_class(bytes));
  const auto it = choices_.find(key);
  if (it == choices_.end()) return "";
  return std::string(algorithm_name(it->second)) + " (" + source_name(sources_.at(key)) + ")";
}

std::optional<Algorithm> Tuner::decided(const Context& ctx, Collective c, std::size_t bytes) const {
  if (forced_.of(c) != Algorithm::kAuto) return forced_.of(c);
  if (ctx.cross != nullptr)
    return Algorithm::kPush;  // across nodes nothing is timed: push within the node, then Gloo
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = choices_.find({c, size_class(bytes)}); it != choices_.end()) return it->second;
  return std::nullopt;
}

Algorithm Tuner::for_call(Context& ctx, Collective c, std::size_t bytes, DType dtype,
                          std::int32_t op, int root, const Scratch& scratch,
                          const RunOnScratch& run) {
  if (auto known = decided(ctx, c, bytes)) return *known;
  const auto key = std::make_pair(c, size_class(bytes));
  if (timing_spent_ms_ >= budget_ms_) {
    // Identical on every rank: the spent time adds up the same published timings.
    std::lock_guard<std::mutex> lock(mu_);
    const Algorithm near =
        nearest_choice(choices_, c, key.second, scope_.small_bytes).value_or(Algorithm::kChunked);
    choices_[key] = near;
    sources_[key] = Source::kNearest;
    return near;
  }
  const auto [chosen, timed] = choose_by_timing(ctx, c, bytes, dtype, op, root, scratch, run);
  {
    std::lock_guard<std::mutex> lock(mu_);
    choices_[key] = chosen;
    sources_[key] = timed ? Source::kTimed : Source::kNoRoom;
  }
  if (timed) learn_choice(scope_, c, key.second, chosen);
  if (timing_spent_ms_ >= budget_ms_) {
    log::write(
        log::Level::kDebug, false,
        fmt::format(
            "shm: the timing budget of {} ms (DDP_SHM_TUNE_BUDGET_MS) is spent; size classes "
            "not timed yet take the nearest timed class's choice",
            budget_ms_));
  }
  if (timed && me_ == 0 && !tune_path_.empty()) save_tune_file(ctx.local_size);
  return chosen;
}

const char* Tuner::source_name(Source s) {
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

std::pair<Algorithm, bool> Tuner::choose_by_timing(Context& ctx, Collective c, std::size_t bytes,
                                                   DType dtype, std::int32_t op, int root,
                                                   const Scratch& scratch,
                                                   const RunOnScratch& run) {
  const auto started = Clock::now();
  const std::vector<Algorithm> candidates =
      shm::candidates(c, bytes, ctx.segment->geometry().small_bytes);
  const std::size_t element = dtype_size(dtype);
  const std::size_t blocks =
      c == Collective::kReduceScatter || c == Collective::kAllGather ? ctx.local_size : 1;
  const std::size_t count =
      std::max<std::size_t>(1, std::min(bytes, shm::kLargestTimedBytes / blocks) / element);
  const std::size_t block = count * element;
  // reduce_scatter's output follows its input.
  const std::size_t scratch_bytes = block * (blocks + (c == Collective::kReduceScatter ? 1 : 0));
  std::string why;
  const std::optional<std::size_t> taken = scratch.take(scratch_bytes, &why);
  const std::int64_t at =
      taken ? static_cast<std::int64_t>(ctx.segment->arena_offset(ctx.me) + *taken) : -1;
  struct Release {
    const Scratch& scratch;
    std::optional<std::size_t> offset;
    std::size_t bytes;
    ~Release() {
      if (offset) scratch.give(*offset, bytes);
    }
  } release{scratch, taken, scratch_bytes};
  Descriptor announce = ctx.descriptor(c, dtype, block, root, op, Algorithm::kAuto, true);
  announce.offset = at;
  ctx.begin(announce);
  if (!ctx.all_in_segment()) {
    log::write(log::Level::kDebug, false,
               std::string("shm: no room to time ") + shm::collective_name(c) + " (" +
                   (taken ? "another rank's arena" : why) + "); it runs through the chunk slots");
    return {Algorithm::kChunked, false};
  }
  char* p = ctx.segment->base() + at;
  const std::size_t total = block * blocks;
  // Fewer runs where each takes longer (a 16 MiB push here: about 3 ms); noise matters less there.
  const int reps = total <= (256u << 10) ? 8
                   : total <= (2u << 20) ? 4
                   : total <= (8u << 20) ? 2
                                         : 1;
  double* mine = ctx.segment->control(ctx.me).timings;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r <= reps; ++r) {  // the first run warms up
      const auto start = Clock::now();
      run(candidates[i], p, count);
      if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    mine[i] = best;
  }
  ctx.phase();  // every rank's times are published
  std::vector<std::vector<double>> seconds(ctx.local_size, std::vector<double>(candidates.size()));
  for (int k = 0; k < ctx.local_size; ++k) {
    for (std::size_t i = 0; i < candidates.size(); ++i)
      seconds[k][i] = ctx.segment->control(k).timings[i];
  }
  std::vector<double> slowest;
  const Algorithm chosen = candidates[shm::choose(seconds, &slowest)];
  // The slowest rank's runs: the same sum on every rank.
  for (double t : slowest) timing_spent_ms_ += t * (reps + 1) * 1e3;
  if (log::enabled(log::Level::kDebug)) {
    log_timed_choice(c, bytes, ctx.local_size, block, candidates, slowest, chosen,
                     Clock::now() - started);
  }
  return {chosen, true};
}

void Tuner::save_tune_file(int local_size) {
  ChoiceTable known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, source] : sources_) {
      if (source != Source::kNearest && source != Source::kNoRoom) known[key] = choices_.at(key);
    }
  }
  static const std::string model = shm::cpu_model();  // read once per process
  const std::string why = shm::write_tune_file(
      tune_path_, shm::format_tune_file(merged(tune_entries_, local_size, known),
                                        model.empty() ? "" : "timed on " + model));
  if (!why.empty() && !tune_warned_) {
    tune_warned_ = true;
    log::write(log::Level::kWarn, true,
               "shm: could not save the algorithm choices to DDP_SHM_TUNE_FILE: " + why);
  }
}

}  // namespace ddp::shm
