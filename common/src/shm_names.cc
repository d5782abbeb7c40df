#include "ddp/common/shm_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ddp/common/proc_stat.h"

namespace ddp {
namespace {

std::string sanitise(const std::string& text, std::size_t longest) {
  std::string out;
  out.reserve(text.size());
  // Escaped, so distinct ids stay distinct: '_' -> "__", other characters
  // outside [A-Za-z0-9.] -> "_" and two hex digits ("a-b" -> "a_2db").
  static const char* hex = "0123456789abcdef";
  for (char c : text) {
    bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.';
    if (keep) {
      out += c;
    } else if (c == '_') {
      out += "__";
    } else {
      auto u = static_cast<unsigned char>(c);
      out += {'_', hex[u >> 4], hex[u & 15]};
    }
  }
  if (out.size() > longest) {
    // Keep names under NAME_MAX: a prefix plus a hash of the whole id.
    std::uint64_t h = 1469598103934665603ull;
    for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(h));
    out = out.substr(0, longest - 17) + "_" + hash;
  }
  return out;
}

// What follows a run's prefix in the name of a process's arena and state
// memory, before the process's pid, and in an heir's name, before its rank:
// made and parsed from these alone.
constexpr char kArenaTag[] = "arena-p";
constexpr char kStateTag[] = "state-p";
constexpr char kArenaHeirTag[] = "arena-heir-r";
constexpr char kStateHeirTag[] = "state-heir-r";

// "<number>i<namespace>" (or the number alone where the namespace is not
// known): a pid or an heir's rank, then the PID namespace it is counted in.
std::string in_namespace(long number) {
  const unsigned long ns = pid_namespace_id();
  return std::to_string(number) + (ns == 0 ? "" : "i" + std::to_string(ns));
}

}  // namespace

unsigned long pid_namespace_id() {
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<unsigned long>(st.st_ino);
}

std::string shm_run_prefix(const std::string& run_id) {
  return "ddp-" + sanitise(run_id, 96) + "-";
}

std::string shm_segment_name(const std::string& run_id, long round, const std::string& group,
                             int node, long pid, const std::string& unique) {
  return "/" + shm_run_prefix(run_id) + "r" + std::to_string(round) + "-" + sanitise(group, 64) +
         "-n" + std::to_string(node) + "-p" + in_namespace(pid) + "-" + sanitise(unique, 32);
}

std::string shm_arena_prefix(const std::string& run_id, long pid) {
  return shm_run_prefix(run_id) + kArenaTag + in_namespace(pid) + "-";
}

std::string shm_arena_name(const std::string& run_id, long pid, const std::string& unique) {
  return "/" + shm_arena_prefix(run_id, pid) + sanitise(unique, 32);
}

std::string shm_arena_heir_name(const std::string& run_id, int rank) {
  return "/" + shm_run_prefix(run_id) + kArenaHeirTag + in_namespace(rank);
}

std::string shm_state_prefix(const std::string& run_id, long pid) {
  return shm_run_prefix(run_id) + kStateTag + in_namespace(pid) + "-";
}

std::string shm_state_name(const std::string& run_id, long pid, const std::string& unique) {
  return "/" + shm_state_prefix(run_id, pid) + sanitise(unique, 32);
}

std::string shm_state_heir_name(const std::string& run_id, int rank) {
  return "/" + shm_run_prefix(run_id) + kStateHeirTag + in_namespace(rank);
}

namespace {

// Renames the first entry of `dir` whose name starts with `prefix` to `to`.
bool rename_first(const std::string& dir, const std::string& prefix, const std::string& to) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) != 0) continue;
    return std::rename(entry.path().c_str(), (dir + to).c_str()) == 0;
  }
  return false;
}

}  // namespace

int pass_carried_memory_to_heir(const std::string& run_id, long pid, int rank,
                                const std::string& dir) {
  return static_cast<int>(
             rename_first(dir, shm_arena_prefix(run_id, pid), shm_arena_heir_name(run_id, rank))) +
         static_cast<int>(
             rename_first(dir, shm_state_prefix(run_id, pid), shm_state_heir_name(run_id, rank)));
}

namespace {

// `text` past the decimal digits it starts with; nullptr when none.
const char* after_digits(const char* text) {
  const char* end = text;
  while (*end >= '0' && *end <= '9') ++end;
  return end == text ? nullptr : end;
}

// Where the creator's pid starts in `rest` (a name after the run's prefix):
// "arena-p<pid>-...", "state-p<pid>-..." or a segment's
// "r<round>-<group>-n<node>-p<pid>-..." (a sanitised group holds no '-');
// nullptr for any other name.
const char* creator_pid_digits(const char* rest) {
  constexpr std::size_t kTag = sizeof(kArenaTag) - 1;
  static_assert(sizeof(kStateTag) - 1 == kTag);
  if (std::strncmp(rest, kArenaTag, kTag) == 0 || std::strncmp(rest, kStateTag, kTag) == 0) {
    return rest + kTag;
  }
  if (*rest != 'r') return nullptr;
  const char* at = after_digits(rest + 1);
  if (at == nullptr || *at != '-') return nullptr;
  at = std::strchr(at + 1, '-');
  if (at == nullptr || at[1] != 'n') return nullptr;
  at = after_digits(at + 2);
  if (at == nullptr || at[0] != '-' || at[1] != 'p') return nullptr;
  return at + 2;
}

// Reads what in_namespace() wrote at `text`: the number, and the namespace
// (0 where the name holds none). Returns past it, or nullptr when `text`
// does not start with a number below 2^30 (no pid or rank is larger).
const char* read_in_namespace(const char* text, long* number, unsigned long* ns) {
  *number = 0;
  *ns = 0;
  const char* at = text;
  for (; *at >= '0' && *at <= '9'; ++at) {
    *number = *number * 10 + (*at - '0');
    if (*number > (1L << 30)) return nullptr;
  }
  if (at == text) return nullptr;
  if (*at != 'i') return at;
  const char* digits = ++at;
  for (; *at >= '0' && *at <= '9'; ++at) {
    if (*ns > (~0UL - 9) / 10) return nullptr;
    *ns = *ns * 10 + static_cast<unsigned long>(*at - '0');
  }
  return at == digits ? nullptr : at;
}

// Whether a name counted in PID namespace `ns` (0: it does not say) belongs
// to another namespace than the sweeper's: a container or node that shares
// /dev/shm but not pids, whose pids mean nothing here and whose own ddprun
// sweeps its files.
bool foreign(unsigned long ns, unsigned long own_ns) { return ns != 0 && ns != own_ns; }

// Whether the sweep of a process in PID namespace `own_ns` keeps `rest` (a
// name after the run's prefix): it was made by a process still running
// (another ddprun of the run on this machine, two nodes on one host or test
// hosts in network namespaces, may still use it), or in another PID
// namespace. An heir's file is its namespace's to sweep. No allocation: the
// orphan guard calls this from a forked child.
bool kept_by_sweep(const char* rest, unsigned long own_ns) {
  long number = 0;
  unsigned long ns = 0;
  for (const char* tag : {kArenaHeirTag, kStateHeirTag}) {
    if (std::strncmp(rest, tag, std::strlen(tag)) == 0) {
      const char* end = read_in_namespace(rest + std::strlen(tag), &number, &ns);
      return end != nullptr && *end == '\0' && foreign(ns, own_ns);
    }
  }
  const char* digits = creator_pid_digits(rest);
  if (digits == nullptr) return false;
  const char* end = read_in_namespace(digits, &number, &ns);
  if (end == nullptr || *end != '-' || number <= 0) return false;
  if (foreign(ns, own_ns)) return true;
  return !process_exited(static_cast<pid_t>(number));  // a zombie's files are nobody's
}

}  // namespace

int remove_segments_with_prefix(const char* dir, const char* prefix) {
  const std::size_t prefix_len = std::strlen(prefix);
  const unsigned long own_ns = pid_namespace_id();
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  alignas(alignof(struct dirent64)) char buf[8192];
  int total = 0;
  // Repeats while a pass removes something, in case removing entries during
  // the listing made it skip some.
  for (int pass = 0; pass < 4; ++pass) {
    if (lseek(fd, 0, SEEK_SET) != 0) break;
    int removed = 0;
    for (;;) {
      ssize_t n = getdents64(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      for (ssize_t off = 0; off < n;) {
        const auto* entry = reinterpret_cast<const struct dirent64*>(buf + off);
        // unlinkat on a /dev/shm entry is what shm_unlink does.
        if (std::strncmp(entry->d_name, prefix, prefix_len) == 0 &&
            !kept_by_sweep(entry->d_name + prefix_len, own_ns) &&
            unlinkat(fd, entry->d_name, 0) == 0) {
          ++removed;
        }
        if (entry->d_reclen == 0) break;
        off += entry->d_reclen;
      }
    }
    total += removed;
    if (removed == 0) break;
  }
  close(fd);
  return total;
}

int remove_run_segments(const std::string& run_id, const std::string& dir) {
  return remove_segments_with_prefix(dir.c_str(), shm_run_prefix(run_id).c_str());
}

}  // namespace ddp
