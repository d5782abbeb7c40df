#include "rpc/subcommand_args.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

namespace ddp::launcher {

int parse_subcommand_args(CLI::App& app, const std::vector<std::string>& argv,
                          const std::function<void(const std::string&)>& report) {
  // CLI11 takes the arguments in reverse order, without the program and subcommand names.
  std::vector<std::string> args(argv.size() > 2 ? argv.begin() + 2 : argv.end(), argv.end());
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    report(e.what());
    return 2;
  }
  return -1;
}

}  // namespace ddp::launcher
