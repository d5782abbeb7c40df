// What every shm collective shares: the descriptor each rank publishes and
// the check that all ranks of the node run the same call the same way.

#include "backends/shm/context.h"

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::shm {
namespace {

// A descriptor's `kind`: the collective, plus one, so a slot nobody wrote (0) names none.
std::uint32_t kind_of(Collective c) { return static_cast<std::uint32_t>(c) + 1; }

const char* kind_name(std::uint32_t kind) {
  if (kind == 0 || kind > kind_of(Collective::kBarrier)) return "an unknown collective";
  return collective_name(static_cast<Collective>(kind - 1));
}

}  // namespace

std::string describe(const Descriptor& d) {
  std::string text = kind_name(d.kind);
  if (d.kind == kind_of(Collective::kBarrier)) return text;
  text += " of " + std::to_string(d.bytes) + " bytes of " + dtype_name(static_cast<DType>(d.dtype));
  if (d.op >= 0) text += " (" + std::string(op_name(static_cast<ReduceOp>(d.op))) + ")";
  if (d.root >= 0) text += " from root " + std::to_string(d.root);
  if (d.timing != 0) text += " (while timing its algorithms)";
  return text;
}

Algorithm runnable(Algorithm wanted, bool can_pull, bool can_push) {
  if (wanted == Algorithm::kPull)
    return can_pull ? wanted : can_push ? Algorithm::kPush : Algorithm::kChunked;
  if (wanted == Algorithm::kPush)
    return can_push ? wanted : can_pull ? Algorithm::kPull : Algorithm::kChunked;
  return Algorithm::kChunked;
}

bool Context::all_in_segment(std::int64_t Descriptor::*where) const {
  for (int k = 0; k < local_size; ++k) {
    if (published(k).*where < 0) return false;
  }
  return true;
}

Descriptor Context::descriptor(Collective c, DType dtype, std::size_t bytes, std::int32_t root,
                               std::int32_t op, Algorithm a, bool timing) const {
  Descriptor d{kind_of(c), static_cast<std::uint32_t>(dtype), bytes, -1, root, op};
  d.algorithm = static_cast<std::uint16_t>(a);
  d.timing = timing ? 1 : 0;
  d.forced = forced;
  d.budget_us = budget_us;
  return d;
}

void Context::begin(const Descriptor& mine) {
  parity = sequence++ & 1;
  segment->control(me).descriptor[parity] = mine;  // published by the phase's release
  phase();
  for (int k = 0; k < local_size; ++k) {
    const Descriptor& d = published(k);
    const std::string ranks_of = "rank " + std::to_string(first_rank + me) + " ";
    const std::string rank_k = ", rank " + std::to_string(first_rank + k) + " ";
    if (d.forced != mine.forced) {
      throw Error("shm: the ranks of this node force different algorithms (DDP_SHM_ALGO): " +
                  ranks_of + Forced::unpacked(mine.forced).describe() + rank_k +
                  Forced::unpacked(d.forced).describe());
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
                  ": " + ranks_of + algorithm_name(static_cast<Algorithm>(mine.algorithm)) +
                  rank_k + algorithm_name(static_cast<Algorithm>(d.algorithm)));
    }
  }
}

}  // namespace ddp::shm
