#pragma once
// The environment a `ddprun --hostfile` job takes to every host: each line of
// a `.ddp_env` file (DeepSpeed's `.deepspeed_env`: NAME=VALUE, in the home
// directory, then the working directory, which wins), then `--env NAME[=VALUE]`
// flags (NAME alone: the front end's value), then PATH and PYTHON_EXEC (and
// DDP_PYTHON) as the front end has them unless one of those set them. Pure:
// the caller reads the files and passes the front end's environment.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;  // in order, names unique

// NAME=VALUE lines; blank lines and lines starting with '#' are skipped, and
// a leading "export " is allowed. Throws ddp::Error "SOURCE:LINE: problem".
EnvList parse_env_file(const std::string& text, const std::string& source);

// The front end's variable NAME, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// --env NAME=VALUE or --env NAME (the front end's value; an error when unset).
std::pair<std::string, std::string> parse_env_flag(const std::string& text,
                                                   const EnvLookup& lookup);

// Sets (or replaces, keeping the first position) NAME in `env`.
void set_env(EnvList& env, const std::string& name, const std::string& value);

// The job's environment: the files' lines (home first, then the working
// directory), the --env flags, then PATH, PYTHON_EXEC and DDP_PYTHON from
// `lookup` when set there and not set before.
EnvList job_environment(const std::vector<EnvList>& files, const std::vector<std::string>& flags,
                        const EnvLookup& lookup);

// Whether `name` is a variable name ([A-Za-z_][A-Za-z0-9_]*).
bool is_env_name(const std::string& name);

}  // namespace ddp::launcher
