#include "cli/value_sources.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "cli/text.h"
#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// "--nproc-per-node" -> "nproc_per_node".
std::string canonical(std::string name) {
  if (name.rfind("--", 0) == 0) name = name.substr(2);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// A '#' outside a quoted string starts a comment.
std::string without_comment(const std::string& line) {
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

bool is_key(const std::string& key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-';
  });
}

}  // namespace

std::map<std::string, std::string> options_given(const std::vector<std::string>& args,
                                                 const std::vector<KnownOption>& options) {
  std::map<std::string, std::string> given;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.empty() || arg[0] != '-' || arg == "-") break;  // the program
    const bool is_long = arg.rfind("--", 0) == 0;
    const auto eq = arg.find('=');
    const std::string name = is_long ? arg.substr(0, eq) : arg;
    for (const KnownOption& option : options) {
      const bool short_form =
          !is_long && option.has_short_name && name.rfind(option.short_name, 0) == 0;
      const bool long_form =
          is_long && std::find(option.long_names.begin(), option.long_names.end(), name) !=
                         option.long_names.end();
      if (!short_form && !long_form) continue;
      std::string value;
      if (long_form && eq != std::string::npos) {
        value = arg.substr(eq + 1);
      } else if (short_form && arg.size() > option.short_name.size()) {
        value = arg.substr(option.short_name.size());
      } else if (option.takes_value && i + 1 < args.size()) {
        value = args[++i];
      }
      given[canonical(option.long_names.front())] = value;
      break;
    }
  }
  return given;
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& names) {
  const std::size_t limit = word.size() >= 12 ? 3 : 2;
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const auto& name : names) {
    const std::size_t d = edit_distance(word, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

std::vector<ConfigEntry> read_config_entries(const std::string& text, const std::string& path,
                                             const std::vector<KnownOption>& options) {
  std::vector<std::string> keys;
  for (const auto& option : options) {
    for (const auto& name : option.long_names) keys.push_back(name.substr(2));
  }
  std::vector<ConfigEntry> entries;
  std::istringstream lines(text);
  std::string raw;
  for (int number = 1; std::getline(lines, raw); ++number) {
    const std::string line = trim(without_comment(raw));
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    const auto eq = line.find('=');
    if (line.front() == '[' && eq == std::string::npos) {
      throw Error(where + "'" + line + "': sections are not read (write KEY = VALUE lines only)");
    }
    const std::string key = eq == std::string::npos ? "" : trim(line.substr(0, eq));
    const std::string value = eq == std::string::npos ? "" : trim(line.substr(eq + 1));
    if (eq == std::string::npos || !is_key(key) || value.empty() || value.front() == '=') {
      throw Error(where + "'" + line + "' is not TOML's KEY = VALUE (e.g. nproc_per_node = 2)");
    }
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::string near = nearest_name(key, keys);
      throw Error(where + "unknown key '" + key + "'" +
                  (near.empty() ? std::string(" (the keys are ddprun's long flags)")
                                : " (did you mean '" + near + "'?)"));
    }
    entries.push_back({key, value, number});
    // An array that goes on over the next lines, up to its closing ']'.
    if (value.front() == '[' && value.back() != ']') {
      while (std::getline(lines, raw)) {
        ++number;
        const std::string more = trim(without_comment(raw));
        entries.back().value += " " + more;
        if (!more.empty() && more.back() == ']') break;
      }
    }
  }
  return entries;
}

ValueSources::ValueSources(const std::map<std::string, std::string>& given,
                           const std::vector<KnownOption>& options,
                           const std::map<std::string, std::string>& envnames,
                           const std::vector<ConfigEntry>& config, const std::string& config_path,
                           const std::function<const char*(const char*)>& getenv) {
  for (const KnownOption& option : options) {
    const std::string name = canonical(option.long_names.front());
    if (given.count(name) > 0) continue;
    // The command line wins over the file, and the file over variables.
    const auto entry = std::find_if(config.rbegin(), config.rend(),
                                    [&](const ConfigEntry& e) { return canonical(e.key) == name; });
    if (entry != config.rend()) {
      labels_[name] = config_path + ":" + std::to_string(entry->line) + ": " + entry->key + " = " +
                      entry->value;
      continue;
    }
    const auto env = envnames.find(option.long_names.front());
    if (env == envnames.end()) continue;
    if (const char* value = getenv(env->second.c_str()); value != nullptr) {
      labels_[name] = env->second + "=" + value;
    }
  }
}

std::string ValueSources::relabel(const std::string& message) const {
  if (message.rfind("--", 0) != 0) return message;
  const auto name_end = message.find_first_of("=: ", 2);
  if (name_end == std::string::npos) return message;
  const auto label = labels_.find(canonical(message.substr(0, name_end)));
  if (label == labels_.end()) return message;
  // "--NAME=VALUE" ends where the message goes on (": why" or " why").
  std::size_t end = name_end;
  if (message[name_end] == '=') {
    end = message.find(": ", name_end);
    const auto space = message.find(' ', name_end);
    if (end == std::string::npos || (space != std::string::npos && space < end)) end = space;
    if (end == std::string::npos) end = message.size();
  }
  return label->second + message.substr(end);
}

}  // namespace ddp::launcher
