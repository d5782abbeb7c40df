#pragma once
// How Healer::sync_state() moves the training state from the members that
// hold the newest one to the members behind (internal to libddp): whole from
// one donor, or striped over several across nodes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/params.h"
#include "ddp/process_group.h"
#include "ddp/store.h"

namespace ddp::detail {

// Stripes of a heal across nodes: more senders share the links, but each
// stripe is a group to connect (its cost grows with the count), so each
// carries at least HealOptions::stripe_bytes.
constexpr std::size_t kMaxStripes = 4;
// A state of at least kBigTransferBytes crosses a node's shared memory in
// chunks of kTransferChunkBytes: they synchronise the ranks a quarter as
// often as the default's 256 KiB (3.1 against 1.3 GB/s, medians, for 1 GiB
// on a 2-vCPU AMD EPYC machine). A small state keeps the default: its
// carrier's larger slots would cost more to fault in than they save.
constexpr std::size_t kTransferChunkBytes = std::size_t{1} << 20;
constexpr std::uint64_t kBigTransferBytes = std::uint64_t{64} << 20;

// The group the state moves on, the options and store its transfer groups
// are made with (no store: the group's own broadcasts). Collective: every
// member of `group` calls the same function with the same arguments.
struct StateTransfer {
  ProcessGroup& group;
  int self_id;
  const ProcessGroupOptions& options;
  const std::shared_ptr<Store>& store;
  const std::vector<std::int64_t>& counts;  // every member's committed count
  std::int64_t most;
  std::size_t chunk_bytes;  // the carriers' shm chunk (0: the group's)

  // `donor` sends every buffer to the members behind, in a group of their
  // own: the members that hold it already neither copy it again nor take the
  // cores the copy needs. On one node, from the donor's state memory, they
  // copy it straight from there (host buffers only: not over NCCL).
  // Returns whether the members behind read the state straight from the
  // donor's state memory.
  bool whole(int donor, const std::vector<ParamBuffer>& state) const;

  // Sender j of `senders` sends share j of every buffer to the members
  // behind, in a group of the two of them; a member behind receives all
  // shares at once. Throws what a transfer threw, the other shares aborted.
  void striped(const std::vector<int>& senders, const std::vector<ParamBuffer>& state) const;

 private:
  std::shared_ptr<ProcessGroup> carrier(const MemberSet& members, const std::string& name) const;
};

}  // namespace ddp::detail
