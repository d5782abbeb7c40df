#pragma once
// The shm collectives within one node (internal to libddp): one free
// function per collective, running the variant it is given over the node's
// segment (algorithms.h names the variants; a variant the call's buffers
// cannot run falls back as runnable() says). Each is collective over the
// node's ranks, with the same arguments on every rank but the buffers; a
// rank that dies or a deadline that passes throws ddp::Error from the phase
// that waited. `timing`: a run on scratch buffers while the ranks time the
// variants (published, so every rank must agree on it). One file each:
// all_reduce.cc (also reduce), broadcast.cc, all_gather.cc,
// reduce_scatter.cc.
//
// A new collective touches four files: algorithms.h (its Collective, and
// its variants if it has several), this one (its function, and its case in
// run_on_scratch when it is timed), a file of its own, and shm_backend.h
// (the Backend override that calls it).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/shm/context.h"

namespace ddp::shm {

// all_reduce of `data` in place. `needed` (all_reduce_partial): the element
// ranges this rank needs, which only the in-place path within one node uses;
// every other path reduces everything.
void all_reduce(Context& ctx, Algorithm a, void* data, std::size_t count, DType dtype, ReduceOp op,
                const std::vector<ElementRange>* needed, bool timing);

// reduce into `root`'s `data`, through the chunk slots.
void reduce(Context& ctx, void* data, std::size_t count, DType dtype, ReduceOp op, int root);

// pull: every rank but the root copies the root's buffer; push: the root
// writes every other rank's buffer; chunked: through the root's slots.
void broadcast(Context& ctx, Algorithm a, void* data, std::size_t count, DType dtype, int root,
               bool timing);

// pull: each rank copies every rank's input (all in the segment) into its
// own output, so a line crosses between cores once (read by its new owner);
// push: each rank writes its input into every rank's output (all in the
// segment), a line moving twice (taken over to write, read back by its
// owner); chunked: through every rank's slots.
void all_gather(Context& ctx, Algorithm a, const void* in, void* out, std::size_t count,
                DType dtype, bool timing);

// Rank r's `out` = block r of every rank's `in`, reduced. pull (every
// rank's `in` in the segment): each rank reduces its block straight from
// the others' inputs; chunked: chunk by chunk through the slots, each rank
// copying in only the blocks the others reduce.
void reduce_scatter(Context& ctx, Algorithm a, const void* in, void* out, std::size_t count,
                    DType dtype, ReduceOp op, bool timing);

// One run of variant `a` of the tuned collective `c` on scratch at `p` in the
// segment (`count` elements per rank's block), as the ranks time the variants.
inline void run_on_scratch(Context& ctx, Collective c, Algorithm a, char* p, std::size_t count,
                           DType dtype, std::int32_t op, int root) {
  const std::size_t block = count * dtype_size(dtype);
  const std::size_t ranks = static_cast<std::size_t>(ctx.local_size);
  const auto reduce_op = static_cast<ReduceOp>(std::max(op, 0));
  switch (c) {
    case Collective::kAllReduce:
      return all_reduce(ctx, a, p, count, dtype, reduce_op, nullptr, true);
    case Collective::kReduceScatter:
      return reduce_scatter(ctx, a, p, p + block * ranks, count, dtype, reduce_op, true);
    case Collective::kAllGather:
      return all_gather(ctx, a, p + block * static_cast<std::size_t>(ctx.me), p, count, dtype,
                        true);
    case Collective::kBroadcast:
      return broadcast(ctx, a, p, count, dtype, root, true);
    case Collective::kReduce:
    case Collective::kBarrier:
      break;  // no variants: never timed
  }
}

}  // namespace ddp::shm
