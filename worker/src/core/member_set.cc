// Groups made from a member set (live recovery): where each member sits, and
// the epoch's scope for keys and segments.

#include <algorithm>
#include <set>

#include "ddp/common/error.h"
#include "ddp/process_group.h"

namespace ddp {
namespace {

// The shm placement of `rank` in `members`: its node's index among the
// set's nodes, and its rank among that node's members. Throws when a node's
// members are not consecutive (the shm backend's layout).
void place(const MemberSet& members, int rank, ProcessGroupOptions& options) {
  std::set<int> seen_nodes;
  int node_index = -1, previous = -1;
  for (int r = 0; r < members.size(); ++r) {
    const int node = members.members[r].node;
    if (node != previous) {
      if (!seen_nodes.insert(node).second) {
        throw Error("process group: the members of node " + std::to_string(node) +
                    " are not consecutive in the member set (" + members.describe() + ")");
      }
      ++node_index;
      previous = node;
    }
    if (r == rank) options.node = node_index;
  }
  const int node = members.members[rank].node;
  options.nodes = static_cast<int>(seen_nodes.size());
  options.local_size = 0;
  options.local_rank = 0;
  for (int r = 0; r < members.size(); ++r) {
    if (members.members[r].node != node) continue;
    if (r < rank) ++options.local_rank;
    ++options.local_size;
  }
}

}  // namespace

int MemberSet::rank_of(int id) const {
  for (int r = 0; r < size(); ++r) {
    if (members[r].id == id) return r;
  }
  return -1;
}

std::string MemberSet::describe() const {
  std::string text;
  for (const Member& m : members) text += (text.empty() ? "" : " ") + std::to_string(m.id);
  return text;
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const MemberSet& members, int self_id,
                                                   std::shared_ptr<Store> store,
                                                   const ProcessGroupOptions& options) {
  const int rank = members.rank_of(self_id);
  if (rank < 0) {
    throw Error("process group: member " + std::to_string(self_id) + " is not in epoch " +
                std::to_string(members.epoch) + "'s member set (" + members.describe() + ")");
  }
  std::set<int> ids;
  for (const Member& m : members.members) {
    if (!ids.insert(m.id).second) {
      throw Error("process group: member " + std::to_string(m.id) + " appears twice in epoch " +
                  std::to_string(members.epoch) + "'s member set");
    }
  }
  ProcessGroupOptions scoped = options;
  place(members, rank, scoped);
  scoped.group_name = options.group_name + "-e" + std::to_string(members.epoch);
  if (store) store = make_prefix_store(store, "e" + std::to_string(members.epoch));
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(rank, members.size(), std::move(store), scoped, members));
}

}  // namespace ddp
