#pragma once
// A shared-memory file that a process of a healing job carries for the
// process ddprun relaunches in its place (internal to libddp): made under a
// name of this process; when the process dies, ddprun renames it for its
// rank's heir (ddp/common/shm_names.h), and the heir takes it over, pages
// and all, instead of memory the kernel must zero afresh (about 1 GB/s on a
// busy virtual machine). The shm backend's carried arena and
// Healer::state_memory() are such files.

#include <cstddef>
#include <string>

namespace ddp::detail {

struct CarriedFile {
  int fd = -1;             // open read-write, close-on-exec; the caller closes it
  bool inherited = false;  // the heir's file, with the pages its predecessor made
};

// A file of `bytes` named `name` (shm_open's form): the file `heir` renamed
// to `name` when it exists with that size, else a new, sparse one (a misfit
// `heir` is removed; "" for none). Throws ddp::Error, `what` ("shm: this
// process's carried arena") and the file's name first, when /dev/shm refuses it.
CarriedFile make_carried_file(const std::string& name, std::size_t bytes, const std::string& heir,
                              const std::string& what);

// Bytes of the open file `fd` that have pages.
std::size_t resident_bytes(int fd);

}  // namespace ddp::detail
