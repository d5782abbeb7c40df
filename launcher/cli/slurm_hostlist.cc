#include "cli/slurm_hostlist.h"

#include <charconv>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// One bracket group's items, each "A" or "A-B" (decimal, B >= A).
struct Range {
  unsigned long long lo = 0, hi = 0;
  std::size_t width = 0;  // digits of the lower bound as written: the padding
};

[[noreturn]] void bad(std::string_view list, const std::string& what) {
  throw Error("hostlist '" + std::string(list) + "': " + what);
}

unsigned long long parse_number(std::string_view list, std::string_view digits) {
  unsigned long long value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    bad(list, "'" + std::string(digits) + "' in brackets is not a number or a range A-B");
  }
  return value;
}

std::vector<Range> parse_group(std::string_view list, std::string_view group) {
  std::vector<Range> ranges;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = group.find(',', start);
    std::string_view item =
        group.substr(start, comma == std::string_view::npos ? group.npos : comma - start);
    std::size_t dash = item.find('-');
    Range r;
    std::string_view lo = item.substr(0, dash);
    r.lo = parse_number(list, lo);
    r.width = lo.size();
    r.hi = dash == std::string_view::npos ? r.lo : parse_number(list, item.substr(dash + 1));
    if (r.hi < r.lo) bad(list, "range '" + std::string(item) + "' runs backwards");
    ranges.push_back(r);
    if (comma == std::string_view::npos) return ranges;
    start = comma + 1;
  }
}

std::string padded(unsigned long long value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Expands one host expression (no top-level comma) into `out`; at `limit`
// hosts it stops, or throws unless `stop_at_limit`.
void expand_expression(std::string_view list, std::string_view expr, std::size_t limit,
                       std::vector<std::string>& out, bool stop_at_limit = false) {
  // Split into literal parts and bracket groups: parts[0] g[0] parts[1] g[1] ...
  std::vector<std::string> parts(1);
  std::vector<std::vector<Range>> groups;
  std::size_t i = 0;
  while (i < expr.size()) {
    char c = expr[i];
    if (c == '[') {
      std::size_t close = expr.find(']', i);
      if (close == std::string_view::npos) bad(list, "'[' without ']'");
      std::string_view inside = expr.substr(i + 1, close - i - 1);
      if (inside.find('[') != std::string_view::npos) bad(list, "brackets inside brackets");
      groups.push_back(parse_group(list, inside));
      parts.emplace_back();
      i = close + 1;
    } else if (c == ']') {
      bad(list, "']' without '['");
    } else {
      parts.back() += c;
      ++i;
    }
  }
  if (groups.empty()) {
    if (parts[0].empty()) bad(list, "an empty host name");
    out.push_back(parts[0]);
    return;
  }
  // Every combination, the last group varying fastest (Slurm's order).
  std::vector<std::size_t> range_of(groups.size(), 0);
  std::vector<unsigned long long> value_of(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) value_of[g] = groups[g][0].lo;
  for (;;) {
    if (out.size() >= limit) {
      if (stop_at_limit) return;
      bad(list, "more than " + std::to_string(limit) + " hosts");
    }
    std::string host = parts[0];
    for (std::size_t g = 0; g < groups.size(); ++g) {
      host += padded(value_of[g], groups[g][range_of[g]].width);
      host += parts[g + 1];
    }
    out.push_back(std::move(host));
    std::size_t g = groups.size();
    for (;;) {
      if (g == 0) return;
      --g;
      const Range& r = groups[g][range_of[g]];
      if (value_of[g] < r.hi) {
        ++value_of[g];
        break;
      }
      if (range_of[g] + 1 < groups[g].size()) {
        ++range_of[g];
        value_of[g] = groups[g][range_of[g]].lo;
        break;
      }
      range_of[g] = 0;
      value_of[g] = groups[g][0].lo;
    }
  }
}

// Splits at commas outside brackets.
std::vector<std::string_view> expressions(std::string_view list) {
  std::vector<std::string_view> exprs;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') ++depth;
    if (list[i] == ']') --depth;
    if (list[i] == ',' && depth == 0) {
      exprs.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  exprs.push_back(list.substr(start));
  return exprs;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list, std::size_t limit) {
  if (list.empty()) bad(list, "empty");
  if (list.find_first_of(" \t\n") != std::string_view::npos) bad(list, "contains white space");
  std::vector<std::string> hosts;
  for (std::string_view expr : expressions(list)) {
    if (expr.empty()) bad(list, "an empty host name");
    expand_expression(list, expr, limit, hosts);
  }
  return hosts;
}

std::string first_host(std::string_view list) {
  if (list.empty()) bad(list, "empty");
  std::string_view expr = expressions(list).front();
  if (expr.empty()) bad(list, "an empty host name");
  std::vector<std::string> first;
  expand_expression(list, expr, 1, first, /*stop_at_limit=*/true);
  return first.front();
}

}  // namespace ddp::launcher
