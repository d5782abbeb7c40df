#pragma once
// Keeping model state identical across ranks before training: check that
// every rank has the same parameters, broadcast them from one rank, and keep
// buffers (running statistics and the like) in sync.
//
// Every function is a collective of its group (the default group, or the one
// given): every rank must call it with the same kind of arguments, in the
// same order. A rank whose arguments differ gets a ddp::Error that names it,
// on every rank, instead of a hang or a silent corruption. In a world of one
// without ddp::init() the default-group forms only check their arguments.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/process_group.h"
#include "ddp/types.h"

namespace ddp {

// What a parameter is, for comparing ranks.
struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::kFloat32;
};

// A parameter's or buffer's memory: `count` elements of `dtype` at `data`
// (host memory on gloo; device memory when the group's backend is nccl).
struct ParamBuffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
};

// Verifies that every rank of the group has the same parameters: the same
// number, and at each index the same name, shape and dtype. Costs one small
// all_gather when they agree; when they do not, every rank throws the same
// ddp::Error describing the first difference and the rank that has it,
// against the parameters most ranks have (ties: the lowest rank's, so with
// two ranks, rank 0's), e.g.
//   check_same_params: parameter 3 'fc2.weight': rank 1 has shape [10, 20], rank 0 has [10, 21]
//   check_same_params: rank 2 has 5 parameters, rank 0 has 4; first difference: ...
void check_same_params(const std::vector<ParamInfo>& params);
void check_same_params(const std::vector<ParamInfo>& params, ProcessGroup& group);
// Pure: the first difference between rank `other_rank`'s parameters and
// rank `reference_rank`'s, in the words above (without the
// "check_same_params: " lead); "" when they are the same.
std::string describe_param_difference(const std::vector<ParamInfo>& reference, int reference_rank,
                                      const std::vector<ParamInfo>& other, int other_rank);

struct SyncOptions {
  // The rank whose values everyone gets (broadcast_params, and kBroadcast).
  int root = 0;
  // Largest collective issued, in bytes: big buffers go in slices of this
  // size, and small host buffers are packed together up to it, so a model of
  // many small tensors costs few collectives and at most two chunks of staging
  // memory are live at a time. Must be > 0.
  std::size_t chunk_bytes = std::size_t{250} << 20;  // 250 MiB, like torch's DDP
};

// Every rank's buffers get root's values. First checks, with one small
// all_gather, that every rank passes the same counts and dtypes (a rank
// that differs is named: call check_same_params first to learn which
// parameter).
void broadcast_params(const std::vector<ParamBuffer>& params, const SyncOptions& options = {});
void broadcast_params(const std::vector<ParamBuffer>& params, ProcessGroup& group,
                      const SyncOptions& options = {});

enum class SyncMode : int {
  // Floating buffers become the mean over ranks; integer buffers (counters
  // such as num_batches_tracked, which a mean would truncate) get root's values.
  kAverage,
  // Every buffer gets root's values.
  kBroadcast,
};

// Synchronizes buffers across ranks according to `mode` (same argument check
// as broadcast_params).
void sync_buffers(const std::vector<ParamBuffer>& buffers, SyncMode mode = SyncMode::kAverage,
                  const SyncOptions& options = {});
void sync_buffers(const std::vector<ParamBuffer>& buffers, SyncMode mode, ProcessGroup& group,
                  const SyncOptions& options = {});

}  // namespace ddp
