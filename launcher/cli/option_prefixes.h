#pragma once
// argparse's abbreviations, which torchrun's command lines rely on
// (`--nnode=2`, `--max_restart 1`): a long option may be shortened to any
// prefix that names one option. Pure: rewrites the launcher's own arguments
// (those before the program) to full names before CLI11 parses them.

#include <string>
#include <vector>

namespace ddp::launcher {

struct KnownOption {
  std::vector<std::string> long_names;  // with "--", every spelling of one option
  bool takes_value = false;             // the next argument is its value unless "=" gave one
  bool has_short_name = false;          // e.g. -r; its value may follow it
  std::string short_name;
};

// Returns `args` (without argv[0]) with each abbreviated long option before
// the program replaced by its full name. An exact name is kept; a prefix of
// several options' names is an error naming the candidates (ddp::Error), as
// argparse's "ambiguous option"; an unknown option is left for the parser to
// refuse. "--" and the program end the launcher's options.
std::vector<std::string> expand_option_prefixes(const std::vector<std::string>& args,
                                                const std::vector<KnownOption>& options);

}  // namespace ddp::launcher
