#include "core/peer_check.h"

#include "ddp/process_group.h"

namespace ddp {
namespace detail {

std::optional<std::string> PeerCheck::gone() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !store_) return std::nullopt;
  const auto now = PeerWatch::Clock::now();
  if (looked_ && now - *looked_ < std::chrono::milliseconds(10)) return std::nullopt;
  looked_ = now;
  if (!watch_) watch_ = std::make_unique<PeerWatch>(store_, rank_, first_local_, local_size_);
  if (auto exited = watch_->first_exited()) return exited;
  return watch_->departed();
}

}  // namespace detail

void ProcessGroup::check_peers() {
  const std::string where =
      "rank " + std::to_string(rank_) + " (epoch " + std::to_string(members_.epoch) + ")";
  if (aborted()) throw Error(where + ": this rank left the group by aborting it");
  if (size_ <= 1) return;
  if (auto why = peer_check_->gone()) throw Error(where + ": a peer is gone: " + *why);
}

}  // namespace ddp
