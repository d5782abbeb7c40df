#pragma once
// torchrun's --redirects / --tee values: "3" applies to every local rank,
// "0:1,2:3" per local rank. 0 = none, 1 = stdout, 2 = stderr, 3 = both.

#include <map>
#include <string>

namespace ddp::launcher {

enum StreamBits : int { kNone = 0, kStdout = 1, kStderr = 2, kBoth = 3 };

struct StreamMap {
  int all = kNone;              // applies to ranks not in per_rank
  std::map<int, int> per_rank;  // local rank -> bits
  int for_rank(int local_rank) const;
  bool any() const;
};

// Throws ddp::Error naming `flag` when `text` is malformed.
StreamMap parse_stream_map(const std::string& flag, const std::string& text);

}  // namespace ddp::launcher
