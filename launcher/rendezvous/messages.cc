#include "rendezvous/messages.h"

#include <cstdio>

namespace ddp::launcher {

std::string seconds(std::chrono::nanoseconds d) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1fs", std::chrono::duration<double>(d).count());
  return text;
}

std::string quote(const std::string& text) {
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + (text.size() > 40 ? "...'" : "'");
}

std::string format_ranks(const std::vector<std::pair<int, int>>& ranges, long count) {
  std::string out = count == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (i == 16) return cat(out, ", ... (", count, " in all)");
    out += cat(i > 0 ? ", " : "", ranges[i].first);
    if (ranges[i].second > ranges[i].first) out += cat("-", ranges[i].second);
  }
  return out;
}

std::string format_ranks(const std::vector<int>& sorted) {
  std::vector<std::pair<int, int>> ranges;
  for (int r : sorted) {
    if (!ranges.empty() && ranges.back().second + 1 == r) {
      ranges.back().second = r;
    } else {
      ranges.emplace_back(r, r);
    }
  }
  return format_ranks(ranges, static_cast<long>(sorted.size()));
}

std::string host_of(const NodeInfo& args) {
  return args.hostname.empty() ? args.address : args.hostname;
}

bool same_node(const NodeInfo& was, const NodeInfo& joiner) {
  if (joiner.node_rank >= 0) return was.node_rank == joiner.node_rank;
  return was.node_rank < 0 && was.hostname == joiner.hostname && was.address == joiner.address;
}

}  // namespace ddp::launcher
