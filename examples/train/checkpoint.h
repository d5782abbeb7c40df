#pragma once
// Checkpoint files: what a run needs to continue exactly where it stopped.
//
// A checkpoint holds text metadata (key=value lines: the step, the epoch and
// a description of the run, see trainer.cc) and a list of raw buffers (the
// weights, then the optimizer's state), followed by a 64-bit FNV-1a checksum
// of everything before it:
//   "DDPTRAIN" | u32 version=1 | u64 metadata bytes | metadata
//   | u64 buffer count | per buffer: u32 dtype, u64 elements, bytes | u64 checksum
// (integers little-endian, as written by this machine).
//
// Writing is atomic: the bytes go to PATH.tmp, which is fsync'ed, renamed
// over PATH, and the directory is fsync'ed, so PATH is always either the old
// checkpoint or the new one, never a torn file, even if the process is killed
// or the machine loses power mid-write.

#include <map>
#include <string>
#include <vector>

#include "ddp/params.h"

namespace train {

using CheckpointMeta = std::map<std::string, std::string>;

// Writes `meta` and the buffers' current contents to `path` atomically.
// Throws ddp::Error naming the path and the failing system call.
void save_checkpoint(const std::string& path, const CheckpointMeta& meta,
                     const std::vector<ddp::ParamBuffer>& buffers);

// Reads `path`: fills `buffers` (whose number, dtypes and counts must match
// the file's, else ddp::Error naming the first buffer that differs) and
// returns the metadata. Throws ddp::Error for a missing, truncated or
// corrupt file (bad magic, version or checksum), naming the path.
CheckpointMeta load_checkpoint(const std::string& path,
                               const std::vector<ddp::ParamBuffer>& buffers);
// Only the metadata of `path` (the file is checked as by load_checkpoint).
CheckpointMeta read_checkpoint_meta(const std::string& path);

}  // namespace train
