#include "core/progress_counter.h"

#include <cstdlib>
#include <optional>

#include "ddp/common/progress_board.h"

namespace ddp::detail {
namespace {

ProgressSlot* my_slot() {
  static ProgressSlot* const slot = []() -> ProgressSlot* {
    const char* local_rank = std::getenv("LOCAL_RANK");
    if (local_rank == nullptr) return nullptr;
    // This process's mapping of the board, for the rest of its life.
    static std::optional<ProgressBoard> board = ProgressBoard::attach_from_env(std::atoi(local_rank));
    if (!board) return nullptr;
    ProgressSlot* s = &board->slot(std::atoi(local_rank));
    s->attached.store(1, std::memory_order_relaxed);
    return s;
  }();
  return slot;
}

}  // namespace

void collective_begun(const char* name) {
  if (ProgressSlot* s = my_slot()) {
    s->op.store(static_cast<std::uint32_t>(progress_op_of(name)), std::memory_order_relaxed);
    s->begun.fetch_add(1, std::memory_order_release);
  }
}

void collective_ended() {
  if (ProgressSlot* s = my_slot()) s->completed.fetch_add(1, std::memory_order_release);
}

}  // namespace ddp::detail
