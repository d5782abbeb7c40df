#include "backends/shm/algorithms.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <tuple>

#include "ddp/common/error.h"

namespace ddp::shm {
namespace {

constexpr Collective kAll[kTunedCollectives] = {Collective::kAllReduce, Collective::kReduceScatter,
                                                Collective::kAllGather, Collective::kBroadcast};
constexpr Algorithm kAllReduceVariants[] = {Algorithm::kPush, Algorithm::kPull, Algorithm::kChunked,
                                            Algorithm::kSmall};
constexpr Algorithm kReduceScatterVariants[] = {Algorithm::kPull, Algorithm::kChunked};
constexpr Algorithm kGatherVariants[] = {Algorithm::kPull, Algorithm::kPush, Algorithm::kChunked};

std::optional<Algorithm> algorithm_named(std::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kPush, Algorithm::kPull, Algorithm::kChunked,
                      Algorithm::kSmall}) {
    if (name == algorithm_name(a)) return a;
  }
  return std::nullopt;
}

bool has_variant(Collective c, Algorithm a) {
  const auto v = variants(c);
  return std::find(v.begin(), v.end(), a) != v.end();
}

std::string variant_list(Collective c) {
  std::string text;
  for (Algorithm a : variants(c))
    text += (text.empty() ? "" : ", ") + std::string(algorithm_name(a));
  return text;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kPush:
      return "push";
    case Algorithm::kPull:
      return "pull";
    case Algorithm::kChunked:
      return "chunked";
    case Algorithm::kSmall:
      return "small";
  }
  return "?";
}

std::optional<Collective> collective_named(std::string_view name) {
  for (Collective c : kAll) {
    if (name == collective_name(c)) return c;
  }
  return std::nullopt;
}

std::span<const Algorithm> variants(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return kAllReduceVariants;
    case Collective::kReduceScatter:
      return kReduceScatterVariants;
    case Collective::kAllGather:
    case Collective::kBroadcast:
      return kGatherVariants;
    case Collective::kReduce:
    case Collective::kBarrier:
      break;
  }
  return {};
}

std::vector<Algorithm> candidates(Collective c, std::size_t bytes, std::size_t small_bytes) {
  std::vector<Algorithm> out;
  for (Algorithm a : variants(c)) {
    if (a != Algorithm::kSmall || bytes <= small_bytes) out.push_back(a);
  }
  return out;
}

std::uint32_t Forced::packed() const {
  std::uint32_t word = 0;
  for (int c = 0; c < kTunedCollectives; ++c) word |= static_cast<std::uint32_t>(by[c]) << (8 * c);
  return word;
}

Forced Forced::unpacked(std::uint32_t packed) {
  Forced f;
  for (int c = 0; c < kTunedCollectives; ++c)
    f.by[c] = static_cast<Algorithm>((packed >> (8 * c)) & 0xff);
  return f;
}

std::string Forced::describe() const {
  for (Algorithm a : {Algorithm::kPush, Algorithm::kPull, Algorithm::kChunked, Algorithm::kSmall}) {
    if (parse_forced(algorithm_name(a), "").by == by)
      return algorithm_name(a);  // what the bare name sets
  }
  std::string text;
  for (Collective c : kAll) {
    if (of(c) == Algorithm::kAuto) continue;
    if (!text.empty()) text += ',';
    text.append(collective_name(c)).append("=").append(algorithm_name(of(c)));
  }
  return text.empty() ? "auto" : text;
}

Forced parse_forced(std::string_view text, std::string_view source) {
  Forced forced;
  const std::string quoted = std::string(source) + "='" + std::string(text) + "'";
  text = trimmed(text);
  if (text.empty() || text == "auto") return forced;
  if (text.find('=') == std::string_view::npos) {
    const auto a = algorithm_named(text);
    if (!a) {
      throw Error(quoted + " is not auto, push, pull, chunked, small or COLLECTIVE=NAME[,...]");
    }
    bool any = false;
    for (Collective c : kAll) {
      if (has_variant(c, *a)) {
        forced.by[static_cast<int>(c)] = *a;
        any = true;
      }
    }
    if (!any) throw Error(quoted + ": no collective has the variant " + std::string(text));
    return forced;
  }
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = trimmed(text.substr(at, comma - at));
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw Error(quoted + ": '" + std::string(item) + "' is not COLLECTIVE=NAME");
    }
    const std::string_view cname = trimmed(item.substr(0, eq)),
                           aname = trimmed(item.substr(eq + 1));
    const auto c = collective_named(cname);
    if (!c) {
      throw Error(quoted + ": '" + std::string(cname) +
                  "' is not one of all_reduce, reduce_scatter, all_gather, broadcast");
    }
    const auto a = algorithm_named(aname);
    if (!a || (*a != Algorithm::kAuto && !has_variant(*c, *a))) {
      throw Error(quoted + ": " + std::string(cname) + " has no variant '" + std::string(aname) +
                  "' (auto, " + variant_list(*c) + ")");
    }
    forced.by[static_cast<int>(*c)] = *a;
    at = comma + 1;
  }
  return forced;
}

int size_class(std::size_t bytes) {
  if (bytes <= class_limit(kFirstClass)) return kFirstClass;
  if (bytes > class_limit(kLastClass - 1)) return kLastClass;
  return std::bit_width(bytes - 1);  // the smallest k with 2^k >= bytes
}

std::size_t class_limit(int size_class) {
  if (size_class >= kLastClass) return std::numeric_limits<std::size_t>::max();
  return std::size_t{1} << size_class;
}

std::size_t choose(const std::vector<std::vector<double>>& seconds, std::vector<double>* slowest) {
  if (seconds.empty() || seconds[0].empty())
    throw Error("shm: no timings to choose an algorithm from");
  const std::size_t n = seconds[0].size();
  std::vector<double> worst(n, 0.0);
  for (const auto& rank : seconds) {
    if (rank.size() != n) throw Error("shm: the ranks timed different numbers of algorithms");
    for (std::size_t c = 0; c < n; ++c) worst[c] = std::max(worst[c], rank[c]);
  }
  const std::size_t best =
      static_cast<std::size_t>(std::min_element(worst.begin(), worst.end()) - worst.begin());
  if (slowest != nullptr) *slowest = std::move(worst);
  return best;
}

std::optional<Algorithm> nearest_choice(const ChoiceTable& table, Collective c, int size_class,
                                        std::size_t small_bytes) {
  std::optional<Algorithm> best;
  int best_distance = std::numeric_limits<int>::max();
  for (const auto& [key, algorithm] : table) {  // ascending classes: the smaller wins a tie
    if (key.first != c || (algorithm == Algorithm::kSmall && class_limit(size_class) > small_bytes))
      continue;
    const int distance = std::abs(key.second - size_class);
    if (distance < best_distance) {
      best_distance = distance;
      best = algorithm;
    }
  }
  return best;
}

double parse_timing_budget(std::string_view text) {
  text = trimmed(text);
  if (text.empty()) return kDefaultTimingBudgetMs;
  double ms = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), ms);
  if (ec != std::errc() || p != text.data() + text.size() || !(ms >= 0) || ms > 1e9) {
    throw Error("environment variable DDP_SHM_TUNE_BUDGET_MS='" + std::string(text) +
                "' is not a number of milliseconds >= 0");
  }
  return ms;
}

std::vector<TuneEntry> parse_tune_file(std::string_view text, const std::string& path) {
  std::vector<TuneEntry> entries;
  int number = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line(trimmed(text.substr(at, end - at)));
    at = end + 1;
    ++number;
    if (line.empty() || line[0] == '#') continue;
    const std::string where =
        "shm tune file " + path + " line " + std::to_string(number) + " ('" + line + "')";
    std::istringstream in(line);
    std::string cname, ranks_text, limit_text, aname, extra;
    if (!(in >> cname >> ranks_text >> limit_text >> aname) || (in >> extra)) {
      throw Error(where + ": expected COLLECTIVE RANKS MAX_BYTES ALGORITHM");
    }
    const auto c = collective_named(cname);
    if (!c) throw Error(where + ": no collective '" + cname + "'");
    int ranks = 0;
    auto [p, ec] = std::from_chars(ranks_text.data(), ranks_text.data() + ranks_text.size(), ranks);
    if (ec != std::errc() || p != ranks_text.data() + ranks_text.size() || ranks < 2) {
      throw Error(where + ": RANKS '" + ranks_text + "' is not a whole number of at least 2");
    }
    int cls = -1;
    if (limit_text == "larger") {
      cls = kLastClass;
    } else {
      std::size_t limit = 0;
      auto [q, ec2] =
          std::from_chars(limit_text.data(), limit_text.data() + limit_text.size(), limit);
      if (ec2 == std::errc() && q == limit_text.data() + limit_text.size() &&
          std::has_single_bit(limit) && limit >= class_limit(kFirstClass) &&
          limit <= class_limit(kLastClass - 1)) {
        cls = std::bit_width(limit) - 1;
      }
    }
    if (cls < 0) {
      throw Error(where + ": MAX_BYTES '" + limit_text +
                  "' is not a power of two from 1024 to 16777216 or 'larger'");
    }
    const auto a = algorithm_named(aname);
    if (!a || *a == Algorithm::kAuto || !has_variant(*c, *a)) {
      throw Error(where + ": " + cname + " has no variant '" + aname + "' (" + variant_list(*c) +
                  ")");
    }
    entries.push_back({*c, ranks, cls, *a});
  }
  return entries;
}

std::vector<TuneEntry> merged(const std::vector<TuneEntry>& entries, int ranks,
                              const ChoiceTable& table) {
  std::vector<TuneEntry> out;
  for (const TuneEntry& e : entries) {
    if (e.ranks != ranks || !table.count({e.collective, e.size_class})) out.push_back(e);
  }
  for (const auto& [key, algorithm] : table)
    out.push_back({key.first, ranks, key.second, algorithm});
  std::stable_sort(out.begin(), out.end(), [](const TuneEntry& a, const TuneEntry& b) {
    return std::tie(a.ranks, a.collective, a.size_class) <
           std::tie(b.ranks, b.collective, b.size_class);
  });
  // A file may name one class twice; the last line counted when it was read, and stays.
  std::vector<TuneEntry> unique;
  for (const TuneEntry& e : out) {
    if (!unique.empty() && unique.back().ranks == e.ranks &&
        unique.back().collective == e.collective && unique.back().size_class == e.size_class) {
      unique.back() = e;
    } else {
      unique.push_back(e);
    }
  }
  return unique;
}

std::string format_tune_file(const std::vector<TuneEntry>& entries, std::string_view comment) {
  std::string text = "# libddp shm algorithm choices (DDP_SHM_TUNE_FILE)";
  if (!comment.empty()) text += ": " + std::string(comment);
  text += "\n# COLLECTIVE RANKS MAX_BYTES ALGORITHM\n";
  for (const TuneEntry& e : entries) {
    text += std::string(collective_name(e.collective)) + " " + std::to_string(e.ranks) + " " +
            (e.size_class >= kLastClass ? std::string("larger")
                                        : std::to_string(class_limit(e.size_class))) +
            " " + algorithm_name(e.algorithm) + "\n";
  }
  return text;
}

ChoiceTable table_for(const std::vector<TuneEntry>& entries, int ranks) {
  ChoiceTable table;
  for (const TuneEntry& e : entries) {
    if (e.ranks == ranks) table[{e.collective, e.size_class}] = e.algorithm;
  }
  return table;
}

}  // namespace ddp::shm
