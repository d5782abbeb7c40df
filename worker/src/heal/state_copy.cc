// The state transfer that reads the donor's carried state memory straight
// from its file (heal/state_memory.h).

#include <fcntl.h>
#include <sys/mman.h>  // shm_open
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "ddp/log.h"
#include "ddp/types.h"
#include "heal/state_memory.h"

namespace ddp::detail {
namespace {

std::size_t bytes_of(const ParamBuffer& b) { return b.count * dtype_size(b.dtype); }

constexpr std::uint64_t kElsewhere = ~std::uint64_t{0};  // a buffer not in the file

// The root's description of its state: each buffer's offset in its carried
// state memory (kElsewhere for one outside it, e.g. a step counter), then
// the file's name; "" when no buffer is there.
std::string describe(const std::vector<ParamBuffer>& state) {
  std::string name;
  std::vector<std::uint64_t> offsets;
  for (const ParamBuffer& b : state) {
    const auto place = state_memory_place(b.data, bytes_of(b));
    offsets.push_back(place ? place->offset : kElsewhere);
    if (place) name = place->file;  // one carried block per process: one name
  }
  if (name.empty()) return "";
  std::string out(offsets.size() * sizeof(std::uint64_t), '\0');
  std::memcpy(out.data(), offsets.data(), out.size());
  return out + name;
}

std::vector<std::uint64_t> offsets_in(const std::string& description, std::size_t buffers) {
  std::vector<std::uint64_t> offsets(buffers);
  std::memcpy(offsets.data(), description.data(), buffers * sizeof(std::uint64_t));
  return offsets;
}

// Reads [offset, offset + bytes) of `fd` into `to`; false on an error or a
// file that ends first.
bool read_fully(int fd, char* to, std::size_t bytes, std::uint64_t offset) {
  while (bytes > 0) {
    const ssize_t n = pread(fd, to, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    to += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

// A piece of one buffer to read from the root's file.
struct Piece {
  char* to;
  std::size_t bytes;
  std::uint64_t offset;
};

// Reads the pieces on up to one thread per CPU (at most 4), each taking the
// next 64 MiB piece: the copy is bound by one core's page-by-page copying,
// and the other ranks wait meanwhile. False when any read failed.
bool read_pieces(int fd, const std::vector<Piece>& pieces) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> ok{true};
  const auto work = [&] {
    for (std::size_t i = next++; i < pieces.size() && ok; i = next++) {
      if (!read_fully(fd, pieces[i].to, pieces[i].bytes, pieces[i].offset)) ok = false;
    }
  };
  const std::size_t helpers =
      std::min<std::size_t>({pieces.size(), std::max(1u, std::thread::hardware_concurrency()), 4});
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < helpers; ++i) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no thread to be had (a process limit): fewer readers
    }
  }
  work();
  for (std::thread& t : threads) t.join();
  return ok;
}

// Reads the buffers the root's file holds; false when the file cannot be
// opened or is too short for them. pread, not a mapping: the kernel copies
// from the file's pages without making page-table entries for them, which
// on small pages cost more than the copy.
bool copy_from(const std::string& description, const std::vector<ParamBuffer>& state) {
  const std::size_t table = state.size() * sizeof(std::uint64_t);
  if (description.size() <= table) return false;
  const std::vector<std::uint64_t> offsets = offsets_in(description, state.size());
  const std::string name = description.substr(table);
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  struct stat st {};
  const auto size = fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
  bool fits = size > 0;
  constexpr std::size_t kPiece = std::size_t{64} << 20;
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < state.size() && fits; ++i) {
    if (offsets[i] == kElsewhere) continue;
    const std::size_t bytes = bytes_of(state[i]);
    fits = offsets[i] <= size && bytes <= size - offsets[i];
    for (std::size_t at = 0; at < bytes && fits; at += kPiece) {
      pieces.push_back(
          {static_cast<char*>(state[i].data) + at, std::min(kPiece, bytes - at), offsets[i] + at});
    }
  }
  fits = fits && read_pieces(fd, pieces);
  close(fd);
  return fits;
}

}  // namespace

bool copy_state_directly(ProcessGroup& group, int root, const std::vector<ParamBuffer>& state) {
  const auto& members = group.members().members;
  const int node = members[static_cast<std::size_t>(root)].node;
  // The same member set on every member: all decide alike without a word.
  if (state.empty() || std::any_of(members.begin(), members.end(),
                                   [&](const Member& m) { return m.node != node; })) {
    return false;
  }
  std::string description = group.rank() == root ? describe(state) : "";
  std::int64_t length = static_cast<std::int64_t>(description.size());
  group.broadcast(&length, 1, DType::kInt64, root);
  if (length == 0) return false;
  description.resize(static_cast<std::size_t>(length));
  group.broadcast(description.data(), description.size(), DType::kUInt8, root);
  const auto t0 = std::chrono::steady_clock::now();
  std::int32_t copied = group.rank() == root || copy_from(description, state) ? 1 : 0;
  if (copied && group.rank() != root) {
    log::debug_all(
        "heal: read the state straight from rank {}'s state memory in {:.1f} ms", root,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  // Also the root's wait: its state must not change while the others read it.
  group.all_reduce(&copied, 1, DType::kInt32, ReduceOp::kMin);
  if (copied != 1) return false;
  // The buffers outside the file (a step counter, a data position) the usual way.
  const std::vector<std::uint64_t> offsets = offsets_in(description, state.size());
  for (std::size_t i = 0; i < state.size(); ++i) {
    if (offsets[i] == kElsewhere)
      group.broadcast(state[i].data, state[i].count, state[i].dtype, root);
  }
  return true;
}

}  // namespace ddp::detail
