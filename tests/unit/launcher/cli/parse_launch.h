#pragma once
// Test support for the launcher's parser: a command line (without argv[0])
// to its LaunchSpec, without looking the program up, or to its error text.

#include <string>
#include <utility>
#include <vector>

#include "cli/launch_spec.h"
#include "ddp/common/error.h"

namespace ddp::launcher {

inline LaunchSpec parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  auto outcome = parse_launch_args(args, /*check_program=*/false);
  if (!outcome.spec) throw Error("no spec: " + outcome.message);
  return *outcome.spec;
}

// The parser's error, or "<no error>".
inline std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace ddp::launcher
