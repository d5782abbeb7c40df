#include "ddp/common/shm_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
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
// memory, before the process's pid: made and parsed from these alone.
constexpr char kArenaTag[] = "arena-p";
constexpr char kStateTag[] = "state-p";

}  // namespace

std::string shm_run_prefix(const std::string& run_id) {
  return "ddp-" + sanitise(run_id, 96) + "-";
}

std::string shm_segment_name(const std::string& run_id, long round, const std::string& group,
                             int node, long pid, const std::string& unique) {
  return "/" + shm_run_prefix(run_id) + "r" + std::to_string(round) + "-" + sanitise(group, 64) +
         "-n" + std::to_string(node) + "-p" + std::to_string(pid) + "-" + sanitise(unique, 32);
}

std::string shm_arena_prefix(const std::string& run_id, long pid) {
  return shm_run_prefix(run_id) + kArenaTag + std::to_string(pid) + "-";
}

std::string shm_arena_name(const std::string& run_id, long pid, const std::string& unique) {
  return "/" + shm_arena_prefix(run_id, pid) + sanitise(unique, 32);
}

std::string shm_arena_heir_name(const std::string& run_id, int rank) {
  return "/" + shm_run_prefix(run_id) + "arena-heir-r" + std::to_string(rank);
}

std::string shm_state_prefix(const std::string& run_id, long pid) {
  return shm_run_prefix(run_id) + kStateTag + std::to_string(pid) + "-";
}

std::string shm_state_name(const std::string& run_id, long pid, const std::string& unique) {
  return "/" + shm_state_prefix(run_id, pid) + sanitise(unique, 32);
}

std::string shm_state_heir_name(const std::string& run_id, int rank) {
  return "/" + shm_run_prefix(run_id) + "state-heir-r" + std::to_string(rank);
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

// Whether `rest` (a name after the run's prefix) was made by a process still
// running: another ddprun of the run on this machine (two nodes on one host,
// or test hosts in network namespaces, which share /dev/shm) may still use
// it. No allocation: the orphan guard calls this from a forked child.
bool of_a_live_process(const char* rest) {
  const char* digits = creator_pid_digits(rest);
  if (digits == nullptr || *digits < '0' || *digits > '9') return false;
  long pid = 0;
  for (; *digits >= '0' && *digits <= '9'; ++digits) {
    pid = pid * 10 + (*digits - '0');
    if (pid > (1L << 30)) return false;  // no such pid
  }
  if (*digits != '-' || pid <= 0) return false;
  return !process_exited(static_cast<pid_t>(pid));  // a zombie's files are nobody's
}

}  // namespace

int remove_segments_with_prefix(const char* dir, const char* prefix) {
  const std::size_t prefix_len = std::strlen(prefix);
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
            !of_a_live_process(entry->d_name + prefix_len) && unlinkat(fd, entry->d_name, 0) == 0) {
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
