#include "heal/state_transfer.h"

#include "heal/state_memory.h"

namespace ddp::detail {
namespace {

// The members of `members` that do not hold step `most`, plus `sender`, in rank order.
MemberSet behind_and(const MemberSet& members, const std::vector<std::int64_t>& counts,
                     std::int64_t most, int sender) {
  MemberSet out{members.epoch, {}};
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (static_cast<int>(i) == sender || counts[i] != most)
      out.members.push_back(members.members[i]);
  }
  return out;
}

}  // namespace

std::shared_ptr<ProcessGroup> StateTransfer::carrier(const MemberSet& members,
                                                     const std::string& name) const {
  ProcessGroupOptions o = options;
  o.group_name += "-" + name;
  if (o.shm_chunk_bytes == 0) o.shm_chunk_bytes = chunk_bytes;
  return ProcessGroup::create(members, self_id, make_prefix_store(store, name), o);
}

bool StateTransfer::whole(int donor, const std::vector<ParamBuffer>& state) const {
  const MemberSet transfer = behind_and(group.members(), counts, most, donor);
  if (transfer.size() == group.size() || !store) {
    if (store && copy_state_directly(group, donor, state)) return true;
    for (const ParamBuffer& b : state) group.broadcast(b.data, b.count, b.dtype, donor);
  } else if (transfer.rank_of(self_id) >= 0) {
    const auto sync = carrier(transfer, "sync");
    const int root = transfer.rank_of(group.members().members[static_cast<std::size_t>(donor)].id);
    if (copy_state_directly(*sync, root, state)) return true;
    for (const ParamBuffer& b : state) sync->broadcast(b.data, b.count, b.dtype, root);
  }
  return false;
}

void StateTransfer::striped(const std::vector<int>& senders,
                            const std::vector<ParamBuffer>& state) const {
  const int me = group.rank();
  const bool behind = counts[static_cast<std::size_t>(me)] != most;
  const std::size_t k = senders.size();
  std::vector<std::shared_ptr<ProcessGroup>> carriers;
  std::vector<std::shared_ptr<Work>> pending;
  try {
    for (std::size_t j = 0; j < k; ++j) {
      if (!behind && senders[j] != me) continue;
      const MemberSet transfer = behind_and(group.members(), counts, most, senders[j]);
      carriers.push_back(carrier(transfer, "sync" + std::to_string(j)));
      const int root =
          transfer.rank_of(group.members().members[static_cast<std::size_t>(senders[j])].id);
      for (const ParamBuffer& b : state) {
        const std::size_t begin = b.count * j / k, end = b.count * (j + 1) / k;
        if (begin == end) continue;
        void* share = static_cast<char*>(b.data) + begin * dtype_size(b.dtype);
        pending.push_back(carriers.back()->broadcast_async(share, end - begin, b.dtype, root));
      }
    }
    for (const auto& w : pending) w->wait();
  } catch (...) {
    for (const auto& c : carriers) c->abort();  // the other shares stop at once
    throw;
  }
}

}  // namespace ddp::detail
