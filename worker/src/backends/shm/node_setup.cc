// How the ranks of one node meet at their segment: local rank 0's
// announcement, the others' attach, the carried arena, and whether every
// node has as many ranks.

#include "backends/shm/node_setup.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "core/init_parts.h"
#include "core/process_identity.h"
#include "ddp/common/error.h"
#include "ddp/common/shm_names.h"
#include "ddp/log.h"

namespace ddp::shm {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> took_over_logged{false};  // once per process

[[noreturn]] void creation_failed(int first_rank, const std::string& published) {
  throw Error("shm: rank " + std::to_string(first_rank) +
              " (local rank 0) could not create this node's segment: " + published.substr(1));
}

}  // namespace

std::unique_ptr<Segment> attach_published(Store& store, const std::string& key, int me,
                                          int local_size, int first_rank,
                                          std::chrono::milliseconds wait,
                                          Clock::time_point deadline) {
  std::string published = store.get(key, wait);
  if (!published.empty() && published[0] == '!') creation_failed(first_rank, published);
  const auto space = published.rfind(' ');
  if (space == std::string::npos || space == 0) {
    throw Error("shm: malformed segment announcement '" + published + "' under " + key);
  }
  const std::string name = published.substr(space + 1);
  const std::string creator = published.substr(0, space);
  const pid_t creator_pid = static_cast<pid_t>(std::atol(creator.c_str() + creator.rfind(' ') + 1));
  const std::string here = detail::pid_namespace_of(detail::process_identity());
  const bool can_see_creator =
      !here.empty() && detail::pid_namespace_of(creator) == here && creator_pid > 0;
  auto next_look = Clock::now() + std::chrono::milliseconds(100);
  for (;;) {
    if (auto segment = Segment::try_attach(name, me, local_size)) return segment;
    if (can_see_creator && process_exited(creator_pid)) {
      shm_unlink(name.c_str());  // ENOENT when it died before creating it
      throw Error("shm: local rank 0 (rank " + std::to_string(first_rank) + ", pid " +
                  std::to_string(creator_pid) + ") exited before it had made segment " + name +
                  "; removed it");
    }
    if (Clock::now() >= deadline) {
      throw Error("shm: local rank 0 (rank " + std::to_string(first_rank) +
                  ") did not make segment " + name + " within the timeout");
    }
    if (Clock::now() >= next_look) {  // a creation that failed replaces the announcement
      published = store.get(key, wait);
      if (!published.empty() && published[0] == '!') creation_failed(first_rank, published);
      next_look = Clock::now() + std::chrono::milliseconds(100);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string run_name(const BackendConfig& config) {
  return config.run_id.empty() ? "anon" + std::to_string(getpid()) : config.run_id;
}

std::shared_ptr<CarriedArena> carried_arena_for(const BackendConfig& config, std::size_t bytes) {
  const std::string run = run_name(config);
  // A relaunched rank of a healing job takes over the arena its
  // predecessor left (ddprun renamed it for this rank).
  std::string heir;
  const auto& env = detail::worker_env();
  if (env && env->heal && env->incarnation > 0 && env->run_id == config.run_id)
    heir = shm_arena_heir_name(run, env->rank);
  auto carried = CarriedArena::get(run, bytes, heir);
  if (carried && carried->inherited() && !took_over_logged.exchange(true)) {
    log::write(log::Level::kInfo, true,
               fmt::format("shm: took over the arena of the process this one replaces ({:.1f} MiB "
                           "of pages made)",
                           static_cast<double>(carried->resident_bytes()) / (1 << 20)));
  }
  return carried;
}

bool same_local_size_on_every_node(const BackendConfig& config, std::chrono::milliseconds wait) {
  const std::string prefix = "shm/local_size/node";
  if (config.local_rank == 0)
    config.store->set(prefix + std::to_string(config.node), std::to_string(config.local_size));
  for (int n = 0; n < config.nodes; ++n) {
    if (config.store->get(prefix + std::to_string(n), wait) != std::to_string(config.local_size))
      return false;
  }
  return true;
}

}  // namespace ddp::shm
