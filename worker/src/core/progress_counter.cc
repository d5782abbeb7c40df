#include "core/progress_counter.h"

#include <time.h>

#include <cstdint>
#include <mutex>
#include <optional>

#include "ddp/common/env_contract.h"
#include "ddp/common/error.h"
#include "ddp/common/progress_board.h"

namespace ddp::detail {
namespace {

struct MySlots {
  ProgressSlot* progress = nullptr;
  StepSlot* steps = nullptr;
};

const MySlots& my_slots() {
  static const MySlots slots = []() -> MySlots {
    // The contract's one parser: a malformed LOCAL_RANK was already refused
    // by init(); a process outside ddprun has no board.
    std::optional<WorkerEnv> env;
    try {
      env = WorkerEnv::from_process_env();
    } catch (const Error&) {
      return {};
    }
    if (!env) return {};
    // This process's mapping of the board, for the rest of its life.
    static std::optional<ProgressBoard> board =
        ProgressBoard::attach(env->progress_fd, env->local_rank, env->local_world_size);
    if (!board) return {};
    ProgressSlot* s = &board->slot(env->local_rank);
    s->attached.store(1, std::memory_order_relaxed);
    return {s, board->step_slot(env->local_rank)};
  }();
  return slots;
}

ProgressSlot* my_slot() { return my_slots().progress; }

std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace

void collective_begun(const char* name) {
  if (ProgressSlot* s = my_slot()) {
    s->op.store(static_cast<std::uint32_t>(progress_op_of(name)), std::memory_order_relaxed);
    record_arrival(*s, monotonic_ns());  // begun, begun_ns and the arrival sum
  }
}

void collective_ended() {
  if (ProgressSlot* s = my_slot()) {
    const std::uint64_t began = s->begun_ns.load(std::memory_order_relaxed);
    const std::uint64_t now = monotonic_ns();
    if (began != 0 && now > began) s->wait_ns.fetch_add(now - began, std::memory_order_relaxed);
    s->completed.fetch_add(1, std::memory_order_release);
  }
}

void step_finished() {
  StepSlot* s = my_slots().steps;
  if (s == nullptr) return;
  static std::mutex mu;
  static StepTimer timer;
  std::lock_guard<std::mutex> lock(mu);
  timer.step_ended(*s, monotonic_ns());
}

}  // namespace ddp::detail
