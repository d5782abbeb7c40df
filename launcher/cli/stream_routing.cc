#include "cli/stream_routing.h"

#include <sstream>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

int parse_bits(const std::string& flag, const std::string& text, const std::string& item) {
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3') return text[0] - '0';
  throw Error(flag + "=" + item + ": expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)");
}

}  // namespace

int StreamMap::for_rank(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? all : it->second;
}

bool StreamMap::any() const {
  if (all != kNone) return true;
  for (const auto& [rank, bits] : per_rank) {
    if (bits != kNone) return true;
  }
  return false;
}

StreamMap parse_stream_map(const std::string& flag, const std::string& text) {
  StreamMap map;
  if (text.empty()) return map;
  if (text.find(':') == std::string::npos) {
    map.all = parse_bits(flag, text, text);
    return map;
  }
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos || colon == 0) {
      throw Error(flag + "=" + text + ": '" + item + "' is not LOCAL_RANK:BITS");
    }
    std::string rank_text = item.substr(0, colon);
    if (rank_text.size() > 6)
      throw Error(flag + "=" + text + ": local rank '" + rank_text + "' is too large");
    for (char c : rank_text) {
      if (c < '0' || c > '9')
        throw Error(flag + "=" + text + ": '" + rank_text + "' is not a local rank");
    }
    int rank = std::stoi(rank_text);
    map.per_rank[rank] = parse_bits(flag, item.substr(colon + 1), item);
  }
  return map;
}

}  // namespace ddp::launcher
