#pragma once
// Which nodes of a group the rendezvous has left out since the group was
// made, and which ranks on other machines their agents saw exit (internal),
// under ddprun --on_failure=heal: a machine that died with its link closes
// no connection, so Gloo would wait on its ranks until the collective's
// timeout, while the rendezvous knows within its heartbeat timeout
// (lost_nodes_key); and no pid of another machine can be looked up
// (exited_rank_key). Only nodes left out after the count was first read are
// news: a node lost before the group was made has no rank in it (its place,
// if taken, is another agent's, whose ranks arrived later).

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "ddp/process_group.h"
#include "ddp/store.h"

namespace ddp::detail {

class LostNodes {
 public:
  // `job`: the rendezvous store (unprefixed); `round`: the rendezvous round
  // the group belongs to; `nodes`: the group's nodes (GROUP_RANKs). Reads
  // how many nodes were left out so far (one store round trip; none known
  // when the store cannot be reached). Throws nothing.
  LostNodes(std::shared_ptr<Store> job, std::int64_t round, std::set<int> nodes);

  // For a group over `members` made by a worker that ddprun launched with
  // --on_failure=heal, when the members span several nodes; else nullopt
  // (on one node a dead member's process says it all).
  static std::optional<LostNodes> of_group(const MemberSet& members);

  // "node N was left out by the rendezvous (<why>)" for the first of the
  // group's nodes left out since construction, else nullopt. Once found,
  // the answer stays (and the store is no longer asked). Copies are
  // independent; one copy is not thread-safe.
  std::optional<std::string> first_lost();

  // Reads the nodes left out since the last reading: one store round trip
  // while there is no news (more when there is); an unreachable store is no
  // news.
  void refresh();

  // Whether node `node` was left out since construction, as of the last
  // refresh() (first_lost() refreshes until it finds one).
  bool lost(int node) const { return lost_.count(node) > 0; }

  // Whether the agent of its node said that the process `pid` of launch
  // rank `rank` exited (exited_rank_key). One store round trip; false when
  // the store cannot be reached.
  bool exited(int rank, long pid) const;

 private:
  std::shared_ptr<Store> job_;
  std::int64_t round_;
  std::set<int> nodes_;
  std::int64_t read_ = 0;  // marks read (or known to be before construction)
  std::set<int> lost_;     // every node left out since construction
  std::string first_;      // the first of nodes_ among them, described
};

}  // namespace ddp::detail
