#include "cli/option_prefixes.h"

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp::launcher {
namespace {

// The option `arg` (without any "=value") names, or nullptr; throws when
// ambiguous. Spellings of one option (--max-restarts, --max_restarts) never
// make a prefix ambiguous.
const KnownOption* resolve(const std::string& name, const std::vector<KnownOption>& options,
                           std::string* full_name) {
  for (const auto& option : options) {
    if (std::find(option.long_names.begin(), option.long_names.end(), name) !=
        option.long_names.end()) {
      *full_name = name;
      return &option;
    }
  }
  std::vector<std::pair<const KnownOption*, std::string>> matches;  // one per option
  for (const auto& option : options) {
    for (const auto& long_name : option.long_names) {
      if (long_name.rfind(name, 0) == 0) {
        matches.emplace_back(&option, long_name);
        break;
      }
    }
  }
  if (matches.size() > 1) {
    std::string list;
    for (size_t i = 0; i < matches.size(); ++i) list += (i == 0 ? "" : ", ") + matches[i].second;
    throw Error("ambiguous option: " + name + " could match " + list);
  }
  if (matches.empty()) return nullptr;
  *full_name = matches.front().second;
  return matches.front().first;
}

}  // namespace

std::vector<std::string> expand_option_prefixes(const std::vector<std::string>& args,
                                                const std::vector<KnownOption>& options) {
  std::vector<std::string> out;
  out.reserve(args.size());
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || arg.empty() || arg[0] != '-' || arg == "-")
      break;  // the program starts here
    if (arg.rfind("--", 0) != 0) {
      // A short option: its value may be glued (-r3) or the next argument.
      out.push_back(arg);
      bool takes_value = std::any_of(options.begin(), options.end(), [&](const KnownOption& o) {
        return o.has_short_name && o.takes_value && o.short_name == arg;
      });
      if (takes_value && i + 1 < args.size()) out.push_back(args[++i]);
      continue;
    }
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    std::string full_name;
    const KnownOption* option = resolve(name, options, &full_name);
    if (option == nullptr) {
      out.push_back(arg);  // unknown: the parser names it
      continue;
    }
    out.push_back(eq == std::string::npos ? full_name : full_name + arg.substr(eq));
    if (option->takes_value && eq == std::string::npos && i + 1 < args.size())
      out.push_back(args[++i]);
  }
  out.insert(out.end(), args.begin() + static_cast<long>(i), args.end());
  return out;
}

}  // namespace ddp::launcher
