#include "core/peer_check.h"

#include "ddp/process_group.h"

namespace ddp {
namespace detail {

std::optional<std::string> PeerCheck::gone() {
  if (known_.load(std::memory_order_acquire)) return gone_;
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !store_) return std::nullopt;
  auto found = look();
  if (found) {
    gone_ = *found;
    known_.store(true, std::memory_order_release);
  }
  return found;
}

std::optional<std::string> PeerCheck::look() {
  const auto now = Clock::now();
  if (looked_ && now - *looked_ < std::chrono::milliseconds(10)) return std::nullopt;
  looked_ = now;
  if (!watch_) {
    watch_ = std::make_unique<PeerWatch>(store_, rank_, first_local_, local_size_, nullptr,
                                         std::move(lost_));
  }
  if (auto exited = watch_->first_exited()) return exited;
  if (spans_nodes_ && (!asked_ || now - *asked_ >= std::chrono::seconds(1))) {
    asked_ = now;
    return watch_->departed();
  }
  return std::nullopt;
}

}  // namespace detail

void ProcessGroup::check_peers() {
  auto where = [this] {
    return "rank " + std::to_string(rank_) + " (epoch " + std::to_string(members_.epoch) + ")";
  };
  if (aborted()) throw Error(where() + ": this rank left the group by aborting it");
  if (size_ <= 1) return;
  if (auto why = peer_check_->gone()) throw Error(where() + ": a peer is gone: " + *why);
}

}  // namespace ddp
