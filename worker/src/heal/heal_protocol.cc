// The heal protocol as the program sees it: settle() at every step
// boundary owns the whole sequence (abort -> release -> reform -> sync ->
// rebuild), so no caller writes it.
//
// Between a state sync and the next step every member asks twice whether
// processes wait to be admitted (a collective): right after the sync, so
// that the program never builds on a group about to be replaced, and after
// the rebuild, so that a process that asked meanwhile (building a large
// GradSync takes a while) is admitted before the step rather than after it.
// A relaunch's first settle() and the survivors' healing settle() run the
// same sequence, so their collectives match call for call.

#include <chrono>
#include <optional>

#include "ddp/heal.h"
#include "ddp/log.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

void require(const HealParticipant& participant) {
  if (!participant.release || !participant.state || !participant.rebuild) {
    throw Error("heal: HealParticipant needs release, state and rebuild");
  }
}

}  // namespace

void Healer::step_failed() noexcept {
  failed_ = true;
  try {
    if (group_) group_->abort();  // peers waiting on this rank stop at once
  } catch (...) {
    // Aborting is best effort: the reform aborts again.
  }
}

Settlement Healer::settle(std::int64_t committed, const HealParticipant& participant) {
  require(participant);
  if (!group_ && !failed_)
    throw Error("heal: settle() without a group (the job finished before admission)");
  Settlement out;
  out.committed = committed;
  bool reform_next = failed_;
  bool first_reform = true;
  std::optional<MemberSet> before;  // the members when the heal in progress began
  const auto t0 = Clock::now();
  for (;;) {
    try {
      if (reform_next) {
        if (group_ && !before) before = group_->members();
        out.before = before;
        if (group_) group_->abort();
        participant.release();
        settled_ = false;
        reform(out.committed, first_reform);
        first_reform = false;
        reform_next = failed_ = false;
        out.change = change_;
        out.reform_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      }
      if (!settled_) {
        out.rebuilt = true;
        if (participant.before_sync) participant.before_sync(*group_, out.committed);
        out.report = sync_state(out.committed, participant.state());
        out.committed = out.report.committed;
        settled_ = true;
        if (arrivals_waiting()) {  // asked while this one formed: admit first
          reform_next = true;
          continue;
        }
        participant.rebuild(*group_, out);
        // The program saw this change: a heal after it is another.
        first_reform = true;
        before.reset();
      }
      if (!arrivals_waiting()) return out;
      reform_next = true;
    } catch (const HealError&) {
      throw;
    } catch (const Error& e) {
      // A member died during the step boundary or the heal: go on without
      // it. Buffers a failed sync half overwrote hold nothing usable.
      log::warn("heal: epoch {} failed at a step boundary ({}); healing",
                group_ ? group_->epoch() : 0, e.what());
      if (torn_) out.committed = -1;
      torn_ = false;
      reform_next = true;
    }
  }
}

}  // namespace ddp
