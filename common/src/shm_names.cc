#include "ddp/common/shm_names.h"

#include <dirent.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>

namespace ddp {
namespace {

std::string sanitise(const std::string& text, std::size_t longest) {
  std::string out;
  out.reserve(text.size());
  // Escaped, so distinct ids stay distinct: '_' -> "__", other characters
  // outside [A-Za-z0-9.] -> "_" and two hex digits ("a-b" -> "a_2db").
  static const char* hex = "0123456789abcdef";
  for (char c : text) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.';
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

}  // namespace

std::string shm_run_prefix(const std::string& run_id) { return "ddp-" + sanitise(run_id, 96) + "-"; }

std::string shm_segment_name(const std::string& run_id, long round, const std::string& group, int node,
                             const std::string& unique) {
  return "/" + shm_run_prefix(run_id) + "r" + std::to_string(round) + "-" + sanitise(group, 64) + "-n" +
         std::to_string(node) + "-" + sanitise(unique, 32);
}

int remove_run_segments(const std::string& run_id, const std::string& dir) {
  const std::string prefix = shm_run_prefix(run_id);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (dirent* entry = readdir(d)) {
    std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    int rc = dir == "/dev/shm" ? shm_unlink(("/" + name).c_str()) : std::remove((dir + "/" + name).c_str());
    if (rc == 0) ++removed;
  }
  closedir(d);
  return removed;
}

}  // namespace ddp
