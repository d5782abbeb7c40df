#pragma once
// Which variant each call of a tuned shm collective runs (internal to
// libddp): forced (DDP_SHM_ALGO or the group's shm_algorithm option), read
// from DDP_SHM_TUNE_FILE, learned by this process's earlier groups, or timed
// by every local rank at the first call of a size class and agreed from one
// table. The tuner drives the variants it times through a callback, so it
// knows nothing of how a collective runs.
//
// Every local rank's tuner starts from the same table and changes it only by
// choices every rank derives from the same published timings, so all ranks
// agree on every call's variant. Calls (for_call) come from the group's one
// collective thread; describe() may be called from any thread.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/shm/context.h"
#include "backends/shm/learned_choices.h"

namespace ddp::shm {

class Tuner {
 public:
  // `forced`: what DDP_SHM_ALGO or the option forces; `budget_ms`: how long
  // the ranks may spend timing in all (DDP_SHM_TUNE_BUDGET_MS).
  Tuner(Forced forced, double budget_ms) : forced_(forced), budget_ms_(budget_ms) {}

  const Forced& forced() const { return forced_; }
  double budget_ms() const { return budget_ms_; }

  // Local rank 0, before the others attach: reads DDP_SHM_TUNE_FILE when it
  // is set and returns its text for the other ranks ("" when unset). Throws
  // ddp::Error naming the file and line when it cannot be read or parsed.
  std::string read_tune_file();

  // Every local rank once all attached: the choices the node starts from,
  // `learned` (each local rank's earlier groups', agreed) and then local rank
  // 0's tune file (`tune_text`) over them. `scope` is what later groups of
  // this process may learn from this one's timings. Throws ddp::Error when
  // rank 0's file text does not parse.
  void start(const ChoiceScope& scope, int me, const std::vector<PackedChoices>& learned,
             const std::string& tune_text);

  // Scratch in this rank's arena for timing: `take` returns an offset in the
  // arena (nullopt with the reason in `why`), `give` returns it.
  struct Scratch {
    std::function<std::optional<std::size_t>(std::size_t bytes, std::string* why)> take;
    std::function<void(std::size_t offset, std::size_t bytes)> give;
  };
  // Runs variant `a` once on scratch at `p`, `count` elements per block.
  using RunOnScratch = std::function<void(Algorithm a, char* p, std::size_t count)>;

  // The variant already decided for a call of `c` of `bytes` (forced, across
  // nodes, or this size class's choice); nullopt when for_call must decide.
  // The fast path of every call: no allocation.
  std::optional<Algorithm> decided(const Context& ctx, Collective c, std::size_t bytes) const;

  // The variant for this call of the tuned collective `c`, decided before
  // its first phase (collective over the node's ranks: every rank asks at the
  // same point of the same call). Forced; across nodes push; else the
  // node's choice for the call's size class, timed first when there is none
  // yet (once the timing budget is spent: the nearest timed class's choice).
  Algorithm for_call(Context& ctx, Collective c, std::size_t bytes, DType dtype, std::int32_t op,
                     int root, const Scratch& scratch, const RunOnScratch& run);

  // What a call of `c` of `bytes` runs and why, e.g. "push (timed)"; ""
  // when nothing is chosen yet. Thread-safe.
  std::string describe(Collective c, std::size_t bytes) const;

 private:
  // Why a class has its choice (what describe() says).
  enum class Source { kTimed, kFile, kEarlier, kNearest, kNoRoom };
  static const char* source_name(Source s);

  // Every local rank runs each candidate on scratch buffers in the segment
  // (zeros; the call's dtype, op, root and size, at most kLargestTimedBytes
  // in all): once to warm up, then a few times, keeping its fastest run.
  // The ranks publish those times and each picks, from the same table, the
  // candidate whose slowest rank was fastest. {chunked, false} without
  // timing when some rank has no room for scratch.
  std::pair<Algorithm, bool> choose_by_timing(Context& ctx, Collective c, std::size_t bytes,
                                              DType dtype, std::int32_t op, int root,
                                              const Scratch& scratch, const RunOnScratch& run);

  // Local rank 0: DDP_SHM_TUNE_FILE with this node's timed choices merged in
  // (a warning naming the file, once, when it cannot be written).
  void save_tune_file(int local_size);

  Forced forced_;
  double budget_ms_;
  double timing_spent_ms_ = 0;  // the slowest rank's timed runs so far (the same on every rank)
  ChoiceScope scope_;
  int me_ = 0;
  mutable std::mutex mu_;  // the tables: describe() reads them from any thread
  ChoiceTable choices_;    // every choice made (or read) so far, the same on every local rank
  std::map<std::pair<Collective, int>, Source> sources_;  // why each was made
  std::string tune_path_;  // DDP_SHM_TUNE_FILE: local rank 0 reads it and saves new choices
  std::vector<TuneEntry> tune_entries_;  // local rank 0: the file as read (every number of ranks)
  bool tune_warned_ = false;
};

}  // namespace ddp::shm
