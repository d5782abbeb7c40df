#include "grad/grad_sync/iteration.h"

#include <algorithm>
#include <string>

#include "ddp/common/error.h"

namespace ddp::detail {

void Iteration::begin(Clock::time_point now) {
  if (active) return;
  active = true;
  sync = no_sync_depth == 0;
  backward_start = now;
  have_backward_start = true;
}

void Iteration::mark_once(const ParamList& params, std::size_t index, std::uint64_t number,
                          const char* what, const char* done) {
  if (marked[index]) {
    throw Error(std::string(params.owner()) + ": " + what + ": parameter '" + params[index].name +
                "' (index " + std::to_string(index) + ") was already " + done + " in iteration " +
                std::to_string(number) +
                "; call finish() at the end of every iteration (no_sync ones too)");
  }
  marked[index] = 1;
  marked_window[index] = 1;
}

void Iteration::require_between(const ParamList& params, const char* what,
                                std::uint64_t number) const {
  if (active) {
    throw Error(std::string(params.owner()) + ": " + what + " was called during iteration " +
                std::to_string(number) +
                " (after begin_backward/mark_ready/add_grad/set_grad, before finish())");
  }
}

void Iteration::note_mark(Clock::time_point now) {
  last_mark = have_last_mark ? std::max(last_mark, now) : now;
  have_last_mark = true;
}

Clock::time_point Iteration::window_start(Clock::time_point enter) const {
  return have_backward_start ? backward_start : enter;
}

Clock::time_point Iteration::window_end(Clock::time_point start) const {
  return have_last_mark ? std::max(last_mark, start) : start;
}

void Iteration::end(bool synced) {
  std::fill(marked.begin(), marked.end(), 0);
  if (synced) std::fill(marked_window.begin(), marked_window.end(), 0);
  active = false;
  have_backward_start = have_last_mark = false;
}

}  // namespace ddp::detail
