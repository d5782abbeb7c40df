#include "cli/job_env.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::launcher {

bool is_env_name(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

void set_env(EnvList& env, const std::string& name, const std::string& value) {
  for (auto& [n, v] : env) {
    if (n == name) {
      v = value;
      return;
    }
  }
  env.emplace_back(name, value);
}

EnvList parse_env_file(const std::string& text, const std::string& source) {
  EnvList env;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    line = line.substr(start);
    if (line.rfind("export ", 0) == 0) line = line.substr(line.find_first_not_of(' ', 7));
    const auto eq = line.find('=');
    const std::string where = source + ":" + std::to_string(number) + ": ";
    if (eq == std::string::npos) throw Error(where + "'" + line + "' is not NAME=VALUE");
    const std::string name = line.substr(0, eq);
    if (!is_env_name(name)) throw Error(where + "'" + name + "' is not a variable name");
    set_env(env, name, line.substr(eq + 1));
  }
  return env;
}

std::pair<std::string, std::string> parse_env_flag(const std::string& text,
                                                   const EnvLookup& lookup) {
  const auto eq = text.find('=');
  const std::string name = text.substr(0, eq);
  if (!is_env_name(name)) throw Error("--env " + text + ": '" + name + "' is not a variable name");
  if (eq != std::string::npos) return {name, text.substr(eq + 1)};
  auto value = lookup(name);
  if (!value) throw Error("--env " + name + ": " + name + " is not set here (give NAME=VALUE)");
  return {name, *value};
}

EnvList job_environment(const std::vector<EnvList>& files, const std::vector<std::string>& flags,
                        const EnvLookup& lookup) {
  EnvList env;
  for (const auto& file : files)
    for (const auto& [name, value] : file) set_env(env, name, value);
  for (const auto& flag : flags) {
    auto [name, value] = parse_env_flag(flag, lookup);
    set_env(env, name, value);
  }
  for (const char* name : {"PATH", "PYTHON_EXEC", "DDP_PYTHON"}) {
    const bool given =
        std::any_of(env.begin(), env.end(), [&](const auto& e) { return e.first == name; });
    if (given) continue;
    if (auto value = lookup(name)) env.emplace_back(name, *value);
  }
  return env;
}

}  // namespace ddp::launcher
