#pragma once
// Reading and writing the shm backend's per-machine tune file
// (DDP_SHM_TUNE_FILE; its format is in shm/algorithms.h). Internal.

#include <string>

namespace ddp::shm {

// The file's text; empty when it does not exist yet. Throws ddp::Error naming
// the file when it exists but cannot be read (a folder, no permission).
std::string read_tune_file(const std::string& path);
// Replaces the file with `text` at once (a temporary file beside it, then
// rename), so a reader never sees half of it. Returns "" or what went wrong.
std::string write_tune_file(const std::string& path, const std::string& text);
// This machine's CPU model (/proc/cpuinfo's first "model name"), or "".
std::string cpu_model();

}  // namespace ddp::shm
