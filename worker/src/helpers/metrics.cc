#include "ddp/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/progress_counter.h"
#include "ddp/common/error.h"
#include "helpers/helpers_internal.h"

namespace ddp {

void step_finished() { detail::step_finished(); }

// ---------------------------------------------------------------- sums, means

void reduce_sum(void* data, std::size_t count, DType dtype, ProcessGroup& group) {
  group.all_reduce(data, count, dtype, ReduceOp::kSum);
}

void reduce_sum(void* data, std::size_t count, DType dtype) {
  if (ProcessGroup* group = detail::helper_group("reduce_sum"))
    reduce_sum(data, count, dtype, *group);
}

void reduce_mean(void* data, std::size_t count, DType dtype, ProcessGroup& group) {
  group.all_reduce(data, count, dtype, ReduceOp::kAvg);
}

void reduce_mean(void* data, std::size_t count, DType dtype) {
  if (ProcessGroup* group = detail::helper_group("reduce_mean"))
    reduce_mean(data, count, dtype, *group);
}

double reduce_mean(double value, ProcessGroup& group) {
  group.all_reduce(&value, 1, DType::kFloat64, ReduceOp::kSum);
  return value / group.size();
}

double reduce_mean(double value) {
  ProcessGroup* group = detail::helper_group("reduce_mean");
  return group ? reduce_mean(value, *group) : value;
}

// ------------------------------------------------------------ average_metrics

namespace {

std::string encode_keys(const Metrics& metrics) {
  detail::Encoder e;
  e.i64(static_cast<std::int64_t>(metrics.size()));
  for (const auto& [key, value] : metrics) e.str(key);
  return e.bytes();
}

std::vector<std::string> decode_keys(const std::string& bytes) {
  detail::Decoder d(bytes, "average_metrics");
  std::int64_t n = d.i64();
  std::vector<std::string> keys;
  for (std::int64_t i = 0; i < n; ++i) keys.push_back(d.str());
  return keys;
}

std::string key_list(const std::vector<std::string>& keys) {
  std::string text = "[";
  for (std::size_t i = 0; i < keys.size(); ++i) text += (i ? ", '" : "'") + keys[i] + "'";
  return text + "]";
}

// Every rank computes the same text from the same gathered keys, against the
// key set most ranks have.
std::string describe_key_mismatch(const std::vector<std::string>& encoded) {
  std::vector<std::vector<std::string>> keys;
  for (const auto& e : encoded) keys.push_back(decode_keys(e));
  const int ref = detail::majority_rank(encoded);
  std::vector<int> differ;
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    if (r != ref && keys[r] != keys[ref]) differ.push_back(r);
  }
  if (differ.empty()) return "average_metrics: metric keys differ across ranks";
  const int first = differ.front();
  std::set<std::string> reference(keys[ref].begin(), keys[ref].end());
  std::set<std::string> theirs(keys[first].begin(), keys[first].end());
  std::vector<std::string> missing, extra;
  for (const auto& k : reference) {
    if (!theirs.count(k)) missing.push_back(k);
  }
  for (const auto& k : theirs) {
    if (!reference.count(k)) extra.push_back(k);
  }
  const std::string them = "rank " + std::to_string(first);
  std::string text = "average_metrics: metric keys differ across ranks: " + them + " has " +
                     key_list(keys[first]) + ", rank " + std::to_string(ref) + " has " +
                     key_list(keys[ref]);
  std::string why;
  if (!missing.empty()) why += them + " lacks " + key_list(missing);
  if (!extra.empty()) why += (why.empty() ? "" : "; ") + them + " has extra " + key_list(extra);
  if (!why.empty()) text += " (" + why + ")";
  if (differ.size() > 1) {
    text +=
        "; ranks differing from rank " + std::to_string(ref) + ": " + detail::join_ranks(differ);
  }
  return text;
}

}  // namespace

Metrics average_metrics(const Metrics& metrics, double count, ProcessGroup& group) {
  if (group.size() == 1) return metrics;
  if (auto all = detail::gather_if_different(group, encode_keys(metrics))) {
    throw Error(describe_key_mismatch(*all));
  }
  std::vector<double> sums;
  sums.reserve(metrics.size() + 1);
  for (const auto& [key, value] : metrics) sums.push_back(value * count);
  sums.push_back(count);
  group.all_reduce(sums.data(), sums.size(), DType::kFloat64, ReduceOp::kSum);
  double total = sums.back();
  if (total == 0) {
    throw Error("average_metrics: the counts sum to 0 over " + std::to_string(group.size()) +
                " ranks (rank " + std::to_string(group.rank()) + " passed " +
                std::to_string(count) + "); nothing to weight the metrics by");
  }
  Metrics averaged;
  std::size_t i = 0;
  for (const auto& [key, value] : metrics)
    averaged.emplace_hint(averaged.end(), key, sums[i++] / total);
  return averaged;
}

Metrics average_metrics(const Metrics& metrics, double count) {
  ProcessGroup* group = detail::helper_group("average_metrics");
  return group ? average_metrics(metrics, count, *group) : metrics;
}

// ----------------------------------------------------------------- memory

namespace {

bool read_text(const char* path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

// The value in kB of the "Name:   123 kB" lines named `field`, summed.
std::uint64_t sum_kb_field(std::string_view text, std::string_view field) {
  std::uint64_t total = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() <= field.size() || line.substr(0, field.size()) != field ||
        line[field.size()] != ':') {
      continue;
    }
    std::uint64_t value = 0;
    bool digits = false;
    for (std::size_t i = field.size() + 1; i < line.size(); ++i) {
      char c = line[i];
      if (c >= '0' && c <= '9') {
        value = value * 10 + static_cast<std::uint64_t>(c - '0');
        digits = true;
      } else if (digits) {
        break;
      }
    }
    total += value;
  }
  return total;
}

}  // namespace

std::uint64_t parse_smaps_uss(std::string_view smaps_text) {
  return (sum_kb_field(smaps_text, "Private_Clean") + sum_kb_field(smaps_text, "Private_Dirty")) *
         1024;
}

std::uint64_t memory_usage() {
  std::string text;
  // smaps_rollup (Linux 4.14+) is one pre-summed record; smaps lists every
  // mapping and is slower to read on big processes.
  if (read_text("/proc/self/smaps_rollup", &text) && !text.empty()) return parse_smaps_uss(text);
  if (read_text("/proc/self/smaps", &text) && !text.empty()) return parse_smaps_uss(text);
  throw Error(
      std::string("memory_usage: cannot read /proc/self/smaps_rollup or /proc/self/smaps: ") +
      std::strerror(errno));
}

MemoryStats memory_stats() {
  MemoryStats stats;
  stats.uss = memory_usage();
  std::string status;
  if (read_text("/proc/self/status", &status)) {
    stats.rss = sum_kb_field(status, "VmRSS") * 1024;
    stats.peak_rss = sum_kb_field(status, "VmHWM") * 1024;
  }
  return stats;
}

}  // namespace ddp
