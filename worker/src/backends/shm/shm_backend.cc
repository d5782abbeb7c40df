// The shm backend's setup (the segment, the Gloo groups it falls back to), the
// guard every collective runs in, which variant a call runs, and allocation.

#include "backends/shm/shm_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "backends/shm/node_setup.h"
#include "backends/shm/variants.h"
#include "core/init_parts.h"
#include "core/process_identity.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"
#include "ddp/log.h"

namespace ddp::shm_backend {
namespace {

// What DDP_SHM_ALGO (or the group's shm_algorithm option, which wins) forces.
shm::Forced forced_from(const std::string& option) {
  if (!option.empty()) return shm::parse_forced(option, "process group option shm_algorithm");
  const char* text = std::getenv("DDP_SHM_ALGO");
  return shm::parse_forced(text == nullptr ? "" : text, "environment variable DDP_SHM_ALGO");
}

// DDP_SHM_TUNE_BUDGET_MS, in milliseconds.
double budget_from_env() {
  const char* text = std::getenv("DDP_SHM_TUNE_BUDGET_MS");
  return shm::parse_timing_budget(text == nullptr ? "" : text);
}

// Which of this process's learned choices (learned_choices.h) a group may use.
shm::ChoiceScope choice_scope(const BackendConfig& config, const shm::Segment& segment) {
  const shm::Geometry& g = segment.geometry();
  return {config.run_id, config.round, config.local_size, g.small_bytes, g.chunk_bytes};
}

void check_fits(const BackendConfig& config) {
  const int me = config.local_rank, local_size = config.local_size;
  const int first_rank = config.rank - config.local_rank;
  if (!config.store) throw Error("process group: the shm backend needs a store");
  if (local_size < 1 || me < 0 || me >= local_size || local_size > config.size || first_rank < 0 ||
      first_rank + local_size > config.size) {
    throw Error("shm: local rank " + std::to_string(me) + " of " + std::to_string(local_size) +
                " does not fit rank " + std::to_string(config.rank) + " of " +
                std::to_string(config.size));
  }
  if (config.nodes < 1 || config.node < 0 || config.node >= config.nodes ||
      (config.nodes == 1 && local_size != config.size)) {
    throw Error("shm: node " + std::to_string(config.node) + " of " + std::to_string(config.nodes) +
                " with " + std::to_string(local_size) + " local ranks does not fit a group of " +
                std::to_string(config.size));
  }
}

}  // namespace

ShmBackend::ShmBackend(const BackendConfig& config)
    : config_(config),
      timeout_(config.timeout),
      connect_(config.connect_timeout.count() > 0 ? std::min(config.connect_timeout, config.timeout)
                                                  : config.timeout),
      tuner_(forced_from(config.shm_algorithm), budget_from_env()) {
  check_fits(config);
  ctx_.me = config.local_rank;
  ctx_.local_size = config.local_size;
  ctx_.first_rank = config.rank - config.local_rank;
  ctx_.size = config.size;
  ctx_.forced = tuner_.forced().packed();
  ctx_.budget_us = static_cast<std::uint32_t>(std::min(tuner_.budget_ms() * 1e3, 4e9));
  if (ctx_.local_size > 1) {
    open_segment();
  } else if (config.shm_carry_arena) {
    // Alone on its node (a group that shrank to this rank here): its blocks
    // still come from the carried arena, whose pages the last group's had,
    // instead of fresh private memory the kernel must zero.
    const std::size_t bytes = shm::Geometry::from_env(1, config.shm_chunk_bytes).arena_bytes;
    if (auto carried = bytes > 0 ? shm::carried_arena_for(config, bytes) : nullptr)
      lone_ = std::make_shared<shm::LoneArena>(std::move(carried));
  }
  if (config.nodes > 1 && shm::same_local_size_on_every_node(config, connect_)) {
    BackendConfig cross = config;
    cross.rank = config.node;
    cross.size = config.nodes;
    cross.store = make_prefix_store(config.store, "cross" + std::to_string(ctx_.me));
    cross_ = make_gloo_backend(cross);
    ctx_.cross = cross_.get();
  }
}

Algorithm ShmBackend::variant_for(Collective c, std::size_t bytes, DType dtype, std::int32_t op,
                                  int root) {
  if (auto known = tuner_.decided(ctx_, c, bytes)) return *known;
  shm::Tuner::Scratch scratch{
      [this](std::size_t n, std::string* why) { return shm::take_pages(my_arena(), n, why, true); },
      [this](std::size_t offset, std::size_t n) { shm::give_pages_back(my_arena(), offset, n); }};
  // The tuner drives each candidate once per timed run, on scratch at `p`.
  auto run = [&](Algorithm a, char* p, std::size_t count) {
    shm::run_on_scratch(ctx_, c, a, p, count, dtype, op, root);
  };
  return tuner_.for_call(ctx_, c, bytes, dtype, op, root, scratch, run);
}

std::string ShmBackend::algorithm_for(const std::string& collective, std::size_t bytes) const {
  const auto c = shm::collective_named(collective);
  if (!c || !single_node()) return "";
  return tuner_.describe(*c, bytes);
}

shm::ArenaView ShmBackend::my_arena() const {
  if (state_) {
    const shm::Segment& segment = *state_->segment;
    return {*state_->pool, segment.arena_fd(), segment.arena_file_offset(),
            segment.base() + segment.arena_offset(ctx_.me), segment.geometry().arena_bytes};
  }
  const shm::CarriedArena& carried = lone_->carried();
  return {*carried.pool(), carried.fd(), 0, lone_->base(), carried.bytes()};
}

std::int64_t ShmBackend::offer_node_shared(std::size_t bytes) {
  if (!state_ || config_.nodes > 1 || ctx_.local_size < 2 || ctx_.me != 0) return -1;
  std::string why;
  // Zeros even where the arena was used before.
  const auto offset = shm::take_pages(my_arena(), bytes, &why, true);
  if (!offset) return -1;
  {
    std::lock_guard<std::mutex> lock(state_->pool->mu);
    state_->node_shared.push_back(*offset);
  }
  return static_cast<std::int64_t>(ctx_.segment->arena_offset(ctx_.me) + *offset);
}

std::shared_ptr<void> ShmBackend::node_shared_at(std::int64_t offset, std::size_t bytes) {
  if (!state_ || offset < 0 ||
      ctx_.segment->offset_of(ctx_.segment->base() + offset, bytes) != offset)
    return nullptr;
  std::shared_ptr<SharedState> keep = state_;  // the mapping lives as long as a reference does
  return std::shared_ptr<void>(ctx_.segment->base() + offset, [keep](void*) {});
}

std::shared_ptr<void> ShmBackend::allocate(std::size_t bytes) {
  if (!state_ && !lone_) return Backend::allocate(bytes);
  std::string why;
  if (auto offset = shm::take_pages(my_arena(), bytes, &why)) {
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

void ShmBackend::open_segment() {
  const int me = ctx_.me, local_size = ctx_.local_size;
  const std::string key = "shm/node" + std::to_string(config_.node);
  const auto deadline = Clock::now() + connect_;
  state_ = std::make_shared<SharedState>();
  const std::string tune_key = "shm/tune/node" + std::to_string(config_.node);
  std::string tune_text;  // local rank 0's tune file, for every local rank
  // This rank's arena: the process's carried one (shm_carry_arena, when its
  // size fits the segment's), mapped in and published; else the segment's.
  auto place_arena = [&] {
    const std::size_t bytes = state_->segment->geometry().arena_bytes;
    if (config_.shm_carry_arena) state_->carried = shm::carried_arena_for(config_, bytes);
    if (!state_->carried) {
      state_->pool = std::make_shared<shm::ArenaPool>(bytes);
      return;
    }
    state_->pool = state_->carried->pool();
    state_->segment->carry_arena(state_->carried->fd(), state_->carried->name());
  };
  if (me == 0) {
    const std::string run = shm::run_name(config_);
    const std::string name = shm_segment_name(run, config_.round, config_.group_name, config_.node,
                                              getpid(), random_hex(8));
    try {
      tune_text = tuner_.read_tune_file();
    } catch (const std::exception& e) {
      config_.store->set(key, "!" + std::string(e.what()));  // peers fail with the reason
      throw;
    }
    // Before the segment's name: peers read it once they attached.
    config_.store->set(tune_key, tune_text);
    // Published before it exists, with this process's identity: if this
    // rank dies while making it, the others know what to remove.
    config_.store->set(key, detail::process_identity() + " " + name);
    try {
      state_->segment = shm::Segment::create(
          name, shm::Geometry::from_env(local_size, config_.shm_chunk_bytes), me);
      place_arena();
    } catch (const std::exception& e) {
      config_.store->set(key, "!" + std::string(e.what()));  // peers fail with the reason
      throw;
    }
  } else {
    state_->segment = shm::attach_published(*config_.store, key, me, local_size, ctx_.first_rank,
                                            connect_, deadline);
    tune_text = config_.store->get(tune_key, connect_);
    place_arena();
  }
  ctx_.segment = state_->segment.get();
  const shm::ChoiceScope scope = choice_scope(config_, *ctx_.segment);
  ctx_.segment->control(me).learned = shm::pack(shm::learned_choices(scope));
  ctx_.segment->mark_attached();
  // Peers' pids are known once all attached (they are watched for death).
  ctx_.segment->wait_attached_and_unlink(deadline);
  ctx_.segment->map_carried_arenas();
  std::vector<shm::PackedChoices> learned;
  for (int k = 0; k < local_size; ++k) learned.push_back(ctx_.segment->control(k).learned);
  tuner_.start(scope, me, learned, tune_text);
  std::vector<shm::Peer> peers;
  for (int k = 0; k < local_size; ++k) {
    peers.push_back({&ctx_.segment->control(k).word,
                     static_cast<pid_t>(ctx_.segment->control(k).pid), ctx_.first_rank + k});
  }
  ctx_.sync = std::make_unique<shm::PhaseSync>(std::move(peers), me,
                                               shm::WaitPolicy::for_ranks(local_size));
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
