#pragma once
// Where the launcher's option values came from, so that an error about a
// value names it as the user wrote it: the flag on the command line, the
// PET_* (or DDP_*) variable, or the --config file's line. Pure: the caller
// passes the arguments, the file's text and a getenv.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cli/option_prefixes.h"

namespace ddp::launcher {

// One KEY = VALUE line of a --config file.
struct ConfigEntry {
  std::string key, value;
  int line = 0;
};

// Reads a --config file's text as the TOML ddprun takes: comments, blank
// lines and KEY = VALUE lines (an array may span lines). Throws ddp::Error
// "PATH:LINE: ..." for a line that is not that (a bare word, a [section]) and
// for a key no option has, with the nearest known key when one is close.
std::vector<ConfigEntry> read_config_entries(const std::string& text, const std::string& path,
                                             const std::vector<KnownOption>& options);

// The launcher's options given on the command line (before the program;
// abbreviations expanded), by name ("nproc_per_node": '-' as '_', no "--"),
// with the value each was given ("" for a flag).
std::map<std::string, std::string> options_given(const std::vector<std::string>& args,
                                                 const std::vector<KnownOption>& options);

// The name in `names` nearest to `word` (edit distance, at most 2, or 3
// for words of 12 letters or more), or "" when none is that close.
std::string nearest_name(const std::string& word, const std::vector<std::string>& names);

// The label of each option whose value did not come from the command line.
class ValueSources {
 public:
  // `given`: options_given() of the launcher's arguments; `envnames`: each
  // option's variable (by its first long name); `config`: the --config
  // file's entries and path ("" when none).
  ValueSources(const std::map<std::string, std::string>& given,
               const std::vector<KnownOption>& options,
               const std::map<std::string, std::string>& envnames,
               const std::vector<ConfigEntry>& config, const std::string& config_path,
               const std::function<const char*(const char*)>& getenv);

  // `message` with a leading "--NAME=VALUE" (either spelling of NAME)
  // replaced by where the value came from: "PET_NPROC_PER_NODE=abc" or
  // "job.toml:3: nproc_per_node = abc". Unchanged when the value was on the
  // command line or the message names no option first.
  std::string relabel(const std::string& message) const;

 private:
  std::map<std::string, std::string> labels_;  // by option name, '-' as '_', no "--"
};

}  // namespace ddp::launcher
