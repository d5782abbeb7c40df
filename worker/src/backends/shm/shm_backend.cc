// The shm backend's setup (the segment, the Gloo groups it falls back to), the
// guard every collective runs in, barrier, allocate and what it reports.

#include "backends/shm/shm_backend.h"

#include "core/init_parts.h"

#include <algorithm>

namespace ddp::shm_backend {

ShmBackend::ShmBackend(const BackendConfig& config)
    : config_(config),
      me_(config.local_rank),
      local_size_(config.local_size),
      first_rank_(config.rank - config.local_rank),
      timeout_(config.timeout),
      connect_(config.connect_timeout.count() > 0 ? std::min(config.connect_timeout, config.timeout)
                                                  : config.timeout),
      forced_(forced_from(config.shm_algorithm)),
      budget_ms_(budget_from_env()) {
  if (!config.store) throw Error("process group: the shm backend needs a store");
  if (local_size_ < 1 || me_ < 0 || me_ >= local_size_ || local_size_ > config.size ||
      first_rank_ < 0 || first_rank_ + local_size_ > config.size) {
    throw Error("shm: local rank " + std::to_string(me_) + " of " + std::to_string(local_size_) +
                " does not fit rank " + std::to_string(config.rank) + " of " +
                std::to_string(config.size));
  }
  if (config.nodes < 1 || config.node < 0 || config.node >= config.nodes ||
      (config.nodes == 1 && local_size_ != config.size)) {
    throw Error("shm: node " + std::to_string(config.node) + " of " + std::to_string(config.nodes) +
                " with " + std::to_string(local_size_) + " local ranks does not fit a group of " +
                std::to_string(config.size));
  }
  if (local_size_ > 1) {
    open_segment();
  } else if (config.shm_carry_arena) {
    // Alone on its node (a group that shrank to this rank here): its blocks
    // still come from the carried arena, whose pages the last group's had,
    // instead of fresh private memory the kernel must zero.
    const std::size_t bytes = shm::Geometry::from_env(1, config.shm_chunk_bytes).arena_bytes;
    if (auto carried = bytes > 0 ? carried_arena(bytes) : nullptr)
      lone_ = std::make_shared<shm::LoneArena>(std::move(carried));
  }
  if (config.nodes > 1 && same_local_size_on_every_node()) {
    BackendConfig cross = config;
    cross.rank = config.node;
    cross.size = config.nodes;
    cross.store = make_prefix_store(config.store, "cross" + std::to_string(me_));
    cross_ = make_gloo_backend(cross);
  }
}

void ShmBackend::barrier() {
  guarded([&] {
    if (!single_node()) return fallback().barrier();
    begin(descriptor(Kind::kBarrier, DType::kUInt8, 0, -1, -1, Algorithm::kAuto, false));
  });
}

std::int64_t ShmBackend::offer_node_shared(std::size_t bytes) {
  if (!state_ || config_.nodes > 1 || local_size_ < 2 || me_ != 0) return -1;
  std::string why;
  const auto offset = take_pages(bytes, &why, true);  // zeros even where the arena was used before
  if (!offset) return -1;
  {
    std::lock_guard<std::mutex> lock(state_->pool->mu);
    state_->node_shared.push_back(*offset);
  }
  return static_cast<std::int64_t>(segment().arena_offset(me_) + *offset);
}

std::shared_ptr<void> ShmBackend::node_shared_at(std::int64_t offset, std::size_t bytes) {
  if (!state_ || offset < 0 || segment().offset_of(segment().base() + offset, bytes) != offset)
    return nullptr;
  std::shared_ptr<SharedState> keep = state_;  // the mapping lives as long as a reference does
  return std::shared_ptr<void>(segment().base() + offset, [keep](void*) {});
}

std::shared_ptr<void> ShmBackend::allocate(std::size_t bytes) {
  if (!state_ && !lone_) return Backend::allocate(bytes);
  std::string why;
  if (auto offset = take_pages(bytes, &why)) {
    // The deleter keeps the mapping (segment or lone arena) and the pool.
    std::shared_ptr<void> keep = state_ ? std::shared_ptr<void>(state_) : lone_;
    std::shared_ptr<shm::ArenaPool> pool = state_ ? state_->pool : lone_->carried().pool();
    const std::size_t off = *offset;
    return std::shared_ptr<void>(my_arena().base + off, [keep, pool, off](void*) {
      std::lock_guard<std::mutex> held(pool->mu);
      pool->allocator.give_back(off);
    });
  }
  if (!warned_.exchange(true)) {
    log::write(log::Level::kWarn, true,
               "shm: allocate(" + std::to_string(bytes) +
                   " bytes) returns private memory because " + why +
                   "; collectives on it copy through shared memory instead of running in place");
  }
  return Backend::allocate(bytes);
}

std::string ShmBackend::algorithm_for(const std::string& collective, std::size_t bytes) const {
  const auto c = shm::collective_named(collective);
  if (!c || !single_node()) return "";
  if (forced_.of(*c) != Algorithm::kAuto)
    return std::string(shm::algorithm_name(forced_.of(*c))) + " (forced)";
  std::lock_guard<std::mutex> lock(choices_mu_);
  const auto key = std::make_pair(*c, shm::size_class(bytes));
  const auto it = choices_.find(key);
  if (it == choices_.end()) return "";
  return std::string(shm::algorithm_name(it->second)) + " (" + source_name(sources_.at(key)) + ")";
}

bool ShmBackend::all_in_segment(std::int64_t Descriptor::*where) const {
  for (int k = 0; k < local_size_; ++k) {
    if (published(k).*where < 0) return false;
  }
  return true;
}

Descriptor ShmBackend::descriptor(Kind kind, DType dtype, std::size_t bytes, std::int32_t root,
                                  std::int32_t op, Algorithm a, bool timing) const {
  Descriptor d{
      static_cast<std::uint32_t>(kind), static_cast<std::uint32_t>(dtype), bytes, -1, root, op};
  d.algorithm = static_cast<std::uint16_t>(a);
  d.timing = timing ? 1 : 0;
  d.forced = forced_.packed();
  d.budget_us = static_cast<std::uint32_t>(std::min(budget_ms_ * 1e3, 4e9));
  return d;
}

void ShmBackend::begin(const Descriptor& mine) {
  parity_ = sequence_++ & 1;
  segment().control(me_).descriptor[parity_] = mine;  // published by the phase's release
  sync_->phase(deadline_);
  for (int k = 0; k < local_size_; ++k) {
    const Descriptor& d = published(k);
    const std::string ranks_of = "rank " + std::to_string(first_rank_ + me_) + " ";
    const std::string rank_k = ", rank " + std::to_string(first_rank_ + k) + " ";
    if (d.forced != mine.forced) {
      throw Error("shm: the ranks of this node force different algorithms (DDP_SHM_ALGO): " +
                  ranks_of + shm::Forced::unpacked(mine.forced).describe() + rank_k +
                  shm::Forced::unpacked(d.forced).describe());
    }
    if (d.budget_us != mine.budget_us) {
      throw Error(
          "shm: the ranks of this node have different timing budgets (DDP_SHM_TUNE_BUDGET_MS): " +
          ranks_of + fmt::format("{} ms", mine.budget_us / 1e3) + rank_k +
          fmt::format("{} ms", d.budget_us / 1e3));
    }
    if (d.kind != mine.kind || d.dtype != mine.dtype || d.bytes != mine.bytes ||
        d.root != mine.root || d.op != mine.op || d.timing != mine.timing) {
      throw CollectiveMismatchError(
          "collective mismatch among the ranks of this node: " + ranks_of + "is in " +
          describe(mine) + rank_k + "in " + describe(d));
    }
    if (d.algorithm != mine.algorithm) {  // the same settings and choices give the same algorithm
      throw Error("shm: the ranks of this node chose different algorithms for " + describe(mine) +
                  ": " + ranks_of + shm::algorithm_name(static_cast<Algorithm>(mine.algorithm)) +
                  rank_k + shm::algorithm_name(static_cast<Algorithm>(d.algorithm)));
    }
  }
}

[[noreturn]] void ShmBackend::creation_failed(const std::string& published) {
  throw Error("shm: rank " + std::to_string(first_rank_) +
              " (local rank 0) could not create this node's segment: " + published.substr(1));
}

std::unique_ptr<shm::Segment> ShmBackend::attach_published(const std::string& key,
                                                           Clock::time_point deadline) {
  std::string published = config_.store->get(key, connect_);
  if (!published.empty() && published[0] == '!') creation_failed(published);
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
    if (auto segment = shm::Segment::try_attach(name, me_, local_size_)) return segment;
    if (can_see_creator && process_exited(creator_pid)) {
      shm_unlink(name.c_str());  // ENOENT when it died before creating it
      throw Error("shm: local rank 0 (rank " + std::to_string(first_rank_) + ", pid " +
                  std::to_string(creator_pid) + ") exited before it had made segment " + name +
                  "; removed it");
    }
    if (Clock::now() >= deadline) {
      throw Error("shm: local rank 0 (rank " + std::to_string(first_rank_) +
                  ") did not make segment " + name + " within the timeout");
    }
    if (Clock::now() >= next_look) {  // a creation that failed replaces the announcement
      published = config_.store->get(key, connect_);
      if (!published.empty() && published[0] == '!') creation_failed(published);
      next_look = Clock::now() + std::chrono::milliseconds(100);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ShmBackend::open_segment() {
  const std::string key = "shm/node" + std::to_string(config_.node);
  const auto deadline = Clock::now() + connect_;
  state_ = std::make_shared<SharedState>();
  const std::string tune_key = "shm/tune/node" + std::to_string(config_.node);
  std::string tune_text;  // local rank 0's tune file, for every local rank
  if (me_ == 0) {
    const std::string run =
        config_.run_id.empty() ? "anon" + std::to_string(getpid()) : config_.run_id;
    const std::string name = shm_segment_name(run, config_.round, config_.group_name, config_.node,
                                              getpid(), random_hex(8));
    if (const char* path = std::getenv("DDP_SHM_TUNE_FILE"); path != nullptr && *path != 0) {
      tune_path_ = path;
      try {
        tune_text = shm::read_tune_file(tune_path_);
        tune_entries_ = shm::parse_tune_file(tune_text, tune_path_);
      } catch (const std::exception& e) {
        config_.store->set(
            key, "!" + std::string(e.what()));  // peers fail with the reason, not a timeout
        throw;
      }
    }
    config_.store->set(tune_key,
                       tune_text);  // before the segment's name: peers read it once they attached
    // Published before it exists, with this process's identity: if this
    // rank dies while making it, the others know what to remove.
    config_.store->set(key, detail::process_identity() + " " + name);
    try {
      state_->segment = shm::Segment::create(
          name, shm::Geometry::from_env(local_size_, config_.shm_chunk_bytes), me_);
      carry_arena();
    } catch (const std::exception& e) {
      config_.store->set(key,
                         "!" + std::string(e.what()));  // peers fail with the reason, not a timeout
      throw;
    }
    segment().control(me_).learned = shm::pack(shm::learned_choices(choice_scope()));
    state_->segment->mark_attached();
    state_->segment->wait_attached_and_unlink(deadline);
  } else {
    state_->segment = attach_published(key, deadline);
    tune_text = config_.store->get(tune_key, connect_);
    carry_arena();
    segment().control(me_).learned = shm::pack(shm::learned_choices(choice_scope()));
    state_->segment->mark_attached();
    // Peers' pids are known once all attached (they are watched for death).
    state_->segment->wait_attached_and_unlink(deadline);
  }
  state_->segment->map_carried_arenas();
  std::vector<shm::PackedChoices> learned;
  for (int k = 0; k < local_size_; ++k) learned.push_back(segment().control(k).learned);
  choices_ = shm::agreed(learned);
  for (const auto& entry : choices_) sources_[entry.first] = Source::kEarlier;
  const shm::ChoiceTable from_file = shm::table_for(
      me_ == 0 ? tune_entries_
               : shm::parse_tune_file(tune_text, "of local rank 0 (DDP_SHM_TUNE_FILE)"),
      local_size_);
  for (const auto& [key, algorithm] : from_file) {
    choices_[key] = algorithm;
    sources_[key] = Source::kFile;
  }
  std::vector<shm::Peer> peers;
  for (int k = 0; k < local_size_; ++k) {
    peers.push_back({&segment().control(k).word, static_cast<pid_t>(segment().control(k).pid),
                     first_rank_ + k});
  }
  sync_ = std::make_unique<shm::PhaseSync>(std::move(peers), me_,
                                           shm::WaitPolicy::for_ranks(local_size_));
}

namespace {
std::atomic<bool> took_over_logged{false};  // once per process
}  // namespace

std::shared_ptr<shm::CarriedArena> ShmBackend::carried_arena(std::size_t bytes) {
  const std::string run =
      config_.run_id.empty() ? "anon" + std::to_string(getpid()) : config_.run_id;
  // A relaunched rank of a healing job takes over the arena its
  // predecessor left (ddprun renamed it for this rank).
  std::string heir;
  const auto& env = detail::worker_env();
  if (env && env->heal && env->incarnation > 0 && env->run_id == config_.run_id)
    heir = shm_arena_heir_name(run, env->rank);
  auto carried = shm::CarriedArena::get(run, bytes, heir);
  if (carried && carried->inherited() && !took_over_logged.exchange(true)) {
    log::write(log::Level::kInfo, true,
               fmt::format("shm: took over the arena of the process this one replaces ({:.1f} MiB "
                           "of pages made)",
                           static_cast<double>(carried->resident_bytes()) / (1 << 20)));
  }
  return carried;
}

void ShmBackend::carry_arena() {
  const std::size_t bytes = segment().geometry().arena_bytes;
  if (config_.shm_carry_arena) state_->carried = carried_arena(bytes);
  if (!state_->carried) {
    state_->pool = std::make_shared<shm::ArenaPool>(bytes);
    return;
  }
  state_->pool = state_->carried->pool();
  segment().carry_arena(state_->carried->fd(), state_->carried->name());
}

bool ShmBackend::same_local_size_on_every_node() {
  const std::string prefix = "shm/local_size/node";
  if (me_ == 0)
    config_.store->set(prefix + std::to_string(config_.node), std::to_string(local_size_));
  for (int n = 0; n < config_.nodes; ++n) {
    if (config_.store->get(prefix + std::to_string(n), connect_) != std::to_string(local_size_))
      return false;
  }
  return true;
}

Backend& ShmBackend::fallback() {
  if (!fallback_) {
    BackendConfig all = config_;
    all.store = make_prefix_store(config_.store, "gloo");
    all.connect_timeout = {};  // made mid-run, at a collective: its peers may lag as much
    fallback_ = make_gloo_backend(all);
  }
  return *fallback_;
}

}  // namespace ddp::shm_backend

namespace ddp {

std::unique_ptr<Backend> make_shm_backend(const BackendConfig& config) {
  return std::make_unique<shm_backend::ShmBackend>(config);
}

Allocator make_lone_shm_allocator(const BackendConfig& config) {
  if (!config.shm_carry_arena || !config.store) return {};
  BackendConfig alone = config;
  alone.local_rank = 0;
  alone.local_size = 1;
  auto backend = std::make_shared<shm_backend::ShmBackend>(alone);
  if (!backend->carries_lone_arena()) return {};
  return [backend](std::size_t bytes) { return backend->allocate(bytes); };
}

}  // namespace ddp
