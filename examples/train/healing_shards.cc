#include "healing_shards.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "ddp/common/error.h"
#include "engine.h"

namespace train {
namespace {

// What a member holds when a reform begins, as all_gather_object carries it.
struct Holding {
  std::int64_t committed = -1;
  std::int32_t updated = 0;  // applied the next step's update to its shard, did not finish it
  std::int32_t whole = 0;
  std::int32_t rank = -1;  // in the layout its shards were cut for
  std::int32_t world = 0;
};

std::vector<Holding> gather_holdings(ddp::ProcessGroup& group, const Holding& mine) {
  std::string bytes(sizeof mine, '\0');
  std::memcpy(bytes.data(), &mine, sizeof mine);
  std::vector<Holding> all;
  for (const std::string& b : group.all_gather_object(bytes)) {
    if (b.size() != sizeof(Holding)) throw ddp::Error("heal: a member's shard record is malformed");
    Holding h;
    std::memcpy(&h, b.data(), sizeof h);
    all.push_back(h);
  }
  return all;
}

}  // namespace

void HealingShards::shard(ddp::ProcessGroup& group) {
  if (!whole_) throw ddp::Error("heal: sharding again needs the whole state on every member");
  auto next = std::make_unique<ddp::ParamShards>(group, model_.grad_params(),
                                                 ddp::ShardOptions{.replicas = true});
  std::vector<float*> views;
  for (std::size_t p = 0; p < model_.num_tensors(); ++p) views.push_back(next->view(p));
  model_.bind(views, true);
  shards_ = std::move(next);
  held_rank_ = group.rank();
  held_world_ = group.size();
}

// fn(buffer, range) for every element range this rank updates (its shard and
// its replica) of the weights and of each optimizer state buffer.
template <typename Fn>
void HealingShards::for_each_kept(Fn&& fn) {
  for (const auto& set : buffer_sets()) {
    for (std::size_t p = 0; p < set.size(); ++p) {
      fn(static_cast<float*>(set[p]), shards_->owned(p));
      fn(static_cast<float*>(set[p]), shards_->replica(p));
    }
  }
}

std::vector<std::vector<void*>> HealingShards::buffer_sets() {
  std::vector<std::vector<void*>> sets{param_pointers(model_)};
  for (const auto& state : opt_.param_shaped_state()) sets.push_back(state);
  return sets;
}

void HealingShards::back_up() {
  std::size_t at = 0;
  for_each_kept([&](float* buffer, ddp::ElementRange r) {
    if (backup_.size() < at + r.size()) backup_.resize(at + r.size());
    std::copy(buffer + r.begin, buffer + r.end, backup_.begin() + static_cast<std::ptrdiff_t>(at));
    at += r.size();
  });
  backup_steps_ = *static_cast<std::int64_t*>(opt_.state().front().data);
}

void HealingShards::take_back() {
  std::size_t at = 0;
  for_each_kept([&](float* buffer, ddp::ElementRange r) {
    std::copy_n(backup_.begin() + static_cast<std::ptrdiff_t>(at), r.size(), buffer + r.begin);
    at += r.size();
  });
  *static_cast<std::int64_t*>(opt_.state().front().data) = backup_steps_;
  updated_ = false;
}

void HealingShards::step(ddp::GradAverager& sync) {
  back_up();
  whole_ = false;
  updated_ = true;
  opt_.begin_step();
  for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
    for (const ddp::ElementRange r : {shards_->owned(p), shards_->replica(p)}) {
      if (!r.empty()) opt_.update_range(p, model_.data(p), sync.grad_view(p), r.begin, r.end);
    }
  }
  shards_->all_gather();
  updated_ = false;
}

void HealingShards::gather() {
  if (!shards_ || whole_) return;
  for (const auto& group : opt_.param_shaped_state()) shards_->all_gather(group);
  whole_ = true;
}

std::uint64_t HealingShards::restore(ddp::ProcessGroup& group, std::int64_t committed) {
  const Holding mine{committed, updated_ ? 1 : 0, whole_ && committed >= 0 ? 1 : 0, held_rank_,
                     held_world_};
  const std::vector<Holding> all = gather_holdings(group, mine);
  std::int64_t most = -1;
  for (const Holding& h : all) most = std::max(most, h.committed);
  if (most < 0) return 0;  // nobody holds anything: the state sync says so
  // A step nobody finished is taken back (the loop redoes it); the one
  // before, which some member finished, every holder of a shard has applied.
  if (committed == most && updated_) take_back();
  auto at_most = [&](const Holding& h) {
    return h.committed == most || (h.committed == most - 1 && h.updated);
  };
  int whole_member = -1, world = 0;
  for (std::size_t m = 0; m < all.size(); ++m) {
    if (all[m].committed == most && all[m].whole && whole_member < 0)
      whole_member = static_cast<int>(m);
    if (at_most(all[m]) && !all[m].whole) world = all[m].world;
  }
  if (world == 0) return 0;  // every member at that step holds everything
  // From a member holding everything (one slice: the whole buffer), else
  // each shard from its owner or the keeper of its replica.
  std::vector<int> held_as(all.size(), -1);
  for (std::size_t m = 0; m < all.size(); ++m) {
    if (whole_member >= 0) {
      held_as[m] = static_cast<int>(m) == whole_member ? 0 : -1;
    } else if (at_most(all[m]) && all[m].world == world) {
      held_as[m] = all[m].rank;
    }
  }
  const std::vector<std::size_t> counts = param_counts(model_);
  const ddp::ShardLayout old =
      ddp::make_shard_layout(counts, std::vector<std::size_t>(counts.size(), sizeof(float)),
                             whole_member >= 0 ? 1 : world);
  const std::uint64_t sent = ddp::ParamShards::restore(group, old, held_as, buffer_sets());
  whole_ = true;
  updated_ = false;
  return sent;
}

}  // namespace train
