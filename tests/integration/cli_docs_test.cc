// docs/cli.md against the commands' --help: every flag that `ddprun --help`,
// `ddprun rendezvous --help` and `ddprun health --help` list has exactly one
// row in that command's table in docs/cli.md (with its environment variable
// when it has one), and docs/cli.md names no flag that no command accepts.
// So the reference page cannot drift from the code: adding a flag without
// documenting it, or removing one and leaving its row, fails here.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kCliDoc = CLI_DOC_PATH;

// One option as --help lists it: its names ("-r", "--redirects") and the
// environment variable CLI11 prints as "(Env:NAME)", if any.
struct HelpOption {
  std::vector<std::string> names;
  std::string env;
  std::string line;
};

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ",") + name;
  return text;
}

std::string help_of(const std::vector<std::string>& subcommand) {
  std::vector<std::string> argv = {kDdprun};
  argv.insert(argv.end(), subcommand.begin(), subcommand.end());
  argv.push_back("--help");
  ProcessResult r = run_process(argv, {}, 30s);
  EXPECT_TRUE(r.exited && r.code == 0) << join(argv) << " failed: " << r.err;
  return r.out;
}

// CLI11's help: "Options:" then one entry per option, each starting with two
// spaces and a dash ("  -t,--tee TEXT (Env:PET_TEE) Send streams ...").
std::vector<HelpOption> parse_help(const std::string& help) {
  std::vector<HelpOption> options;
  std::istringstream lines(help);
  std::string line;
  const std::regex env_re(R"(\(Env:([A-Za-z0-9_]+)\))");
  while (std::getline(lines, line)) {
    if (line.rfind("  -", 0) != 0) continue;
    HelpOption option;
    option.line = line;
    std::string names = line.substr(2, line.find(' ', 2) - 2);
    std::stringstream parts(names);
    std::string name;
    while (std::getline(parts, name, ',')) option.names.push_back(name);
    std::smatch m;
    if (std::regex_search(line, m, env_re)) option.env = m[1];
    options.push_back(option);
  }
  return options;
}

// A table row of docs/cli.md that documents flags: the flags named in its
// first cell (the first word of each `code span` that starts with a dash).
struct DocRow {
  std::set<std::string> flags;
  std::string text;
  int line = 0;
};

// The cells of a markdown table row, "\|" staying inside a cell.
std::vector<std::string> cells_of(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.push_back(cell);
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return cells;
}

// The rows under the "## <heading>" of docs/cli.md, up to the next "## ".
std::vector<DocRow> rows_under(const std::string& doc, const std::string& heading) {
  std::vector<DocRow> rows;
  std::istringstream lines(doc);
  std::string line;
  bool inside = false, found = false;
  int number = 0;
  const std::regex span_re("`(-[^` ]+)[^`]*`");
  while (std::getline(lines, line)) {
    ++number;
    if (line.rfind("## ", 0) == 0) {
      inside = line == "## " + heading;
      found = found || inside;
      continue;
    }
    if (!inside || line.rfind("|", 0) != 0) continue;
    std::vector<std::string> cells = cells_of(line);
    if (cells.empty()) continue;
    DocRow row;
    row.text = line;
    row.line = number;
    for (std::sregex_iterator it(cells[0].begin(), cells[0].end(), span_re), end; it != end; ++it) {
      row.flags.insert((*it)[1]);
    }
    if (!row.flags.empty()) rows.push_back(row);
  }
  EXPECT_TRUE(found) << kCliDoc << " has no heading '## " << heading << "'";
  return rows;
}

// The command's --help and its section of docs/cli.md agree both ways.
void expect_documented(const std::vector<std::string>& subcommand, const std::string& heading) {
  const std::string command = "ddprun" + (subcommand.empty() ? "" : " " + join(subcommand));
  const std::vector<HelpOption> options = parse_help(help_of(subcommand));
  ASSERT_GE(options.size(), 2u) << command << " --help lists no options";
  const std::vector<DocRow> rows = rows_under(read_file(kCliDoc), heading);
  std::set<std::string> known;
  for (const auto& option : options) {
    known.insert(option.names.begin(), option.names.end());
    std::vector<const DocRow*> matching;
    for (const auto& row : rows) {
      if (std::any_of(option.names.begin(), option.names.end(),
                      [&](const std::string& name) { return row.flags.count(name) > 0; })) {
        matching.push_back(&row);
      }
    }
    if (matching.empty()) {
      ADD_FAILURE() << command << " --help lists " << join(option.names) << ", which " << kCliDoc
                    << " does not document under '## " << heading << "' (add a table row)\n  "
                    << option.line;
      continue;
    }
    if (matching.size() > 1) {
      ADD_FAILURE() << join(option.names) << " is documented " << matching.size()
                    << " times under '## " << heading << "' (lines " << matching[0]->line << " and "
                    << matching[1]->line << "): document each flag once";
    }
    if (!option.env.empty()) {
      EXPECT_NE(matching[0]->text.find("`" + option.env + "`"), std::string::npos)
          << join(option.names) << " reads " << option.env << ", which its row (line "
          << matching[0]->line << ") does not name";
    }
  }
  for (const auto& row : rows) {
    for (const auto& flag : row.flags) {
      EXPECT_TRUE(known.count(flag) > 0)
          << kCliDoc << ":" << row.line << " documents " << flag << " under '## " << heading
          << "', but " << command << " --help does not list it";
    }
  }
}

TEST(CliDocs, EveryFlagOfDdprunIsDocumentedOnce) { expect_documented({}, "Options of ddprun"); }

TEST(CliDocs, EveryFlagOfRendezvousIsDocumentedOnce) {
  expect_documented({"rendezvous"}, "Options of ddprun rendezvous");
}

TEST(CliDocs, EveryFlagOfHealthIsDocumentedOnce) {
  expect_documented({"health"}, "Options of ddprun health");
}

TEST(CliDocs, EveryFlagOfStatusIsDocumentedOnce) {
  expect_documented({"status"}, "Options of ddprun status");
}

// Anywhere on the page (prose, examples), a --flag must be one that some
// command accepts: a removed or renamed flag cannot linger in the text.
TEST(CliDocs, NamesNoFlagThatNoCommandAccepts) {
  std::set<std::string> known;
  for (const auto& sub :
       std::vector<std::vector<std::string>>{{}, {"rendezvous"}, {"health"}, {"status"}}) {
    for (const auto& option : parse_help(help_of(sub)))
      known.insert(option.names.begin(), option.names.end());
  }
  const std::string doc = read_file(kCliDoc);
  const std::regex flag_re("--[A-Za-z][A-Za-z0-9_-]*");
  std::istringstream lines(doc);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    for (std::sregex_iterator it(line.begin(), line.end(), flag_re), end; it != end; ++it) {
      std::string flag = it->str();
      while (!flag.empty() && (flag.back() == '-' || flag.back() == '_')) flag.pop_back();
      EXPECT_TRUE(known.count(flag) > 0) << kCliDoc << ":" << number << " names " << flag
                                         << ", which no ddprun command accepts:\n  " << line;
    }
  }
}

// The --rdzv_conf keys that ddprun --help lists each have a row.
TEST(CliDocs, DocumentsEveryRdzvConfKey) {
  const std::string help = help_of({});
  const std::string lead = "key=value,...:";
  auto at = help.find(lead);
  ASSERT_NE(at, std::string::npos) << "ddprun --help no longer describes --rdzv_conf as " << lead;
  at += lead.size();
  const std::string description = help.substr(at, help.find('\n', at) - at);
  const std::string doc = read_file(kCliDoc);
  const std::regex key_re("[a-z_]+");
  int keys = 0;
  for (std::sregex_iterator it(description.begin(), description.end(), key_re), end; it != end;
       ++it, ++keys) {
    EXPECT_NE(doc.find("`" + it->str() + "`"), std::string::npos)
        << "--rdzv_conf key " << it->str() << " (ddprun --help) is not documented in " << kCliDoc;
  }
  EXPECT_GE(keys, 10) << description;
}

}  // namespace
}  // namespace ddp::testing
