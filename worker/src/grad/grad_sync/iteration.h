#pragma once
// One iteration's hand-over bookkeeping, common to GradSync and
// SharedGradSum (internal; every member guarded by the owner's mutex): the
// no_sync depth, whether an iteration is under way and in which mode, which
// parameters were handed over (in this iteration, and since the last synced
// one), and the backward window's ends.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "grad/grad_sync/param_list.h"

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

// Milliseconds of a duration.
inline double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Iteration {
  int no_sync_depth = 0;
  bool active = false;              // begun (by begin_backward or a hand-over), not finished
  bool sync = true;                 // fixed when it begins: no NoSync alive then
  std::vector<char> marked;         // per parameter: handed over in this iteration
  std::vector<char> marked_window;  // per parameter: since the last synced iteration
  Clock::time_point backward_start{}, last_mark{};
  bool have_backward_start = false, have_last_mark = false;

  explicit Iteration(std::size_t params) : marked(params, 0), marked_window(params, 0) {}

  // Begins an iteration at `now` unless one is under way.
  void begin(Clock::time_point now);
  // Flags parameter `index` handed over; throws (naming it, `what` the call,
  // `done` in the past tense, `number` the iteration) when it already was.
  void mark_once(const ParamList& params, std::size_t index, std::uint64_t number, const char* what,
                 const char* done);
  // Throws, naming `what`, while an iteration (number `number`) is under way.
  void require_between(const ParamList& params, const char* what, std::uint64_t number) const;
  // Notes a hand-over completed at `now` (the backward window's end).
  void note_mark(Clock::time_point now);
  // The backward window: begin_backward (else `enter`) .. the last hand-over.
  Clock::time_point window_start(Clock::time_point enter) const;
  Clock::time_point window_end(Clock::time_point start) const;
  // Ends the iteration (marks cleared; the window's flags too when `synced`).
  void end(bool synced);
};

}  // namespace ddp::detail
