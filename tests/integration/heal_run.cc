#include "heal_run.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

namespace ddp::testing {

using namespace std::chrono_literals;

const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = HEAL_FAULT_WORKER_PATH;
std::vector<std::string> train_args(const std::string& dir, std::int64_t steps) {
  return {"--steps",        std::to_string(steps),
          "--hidden",       "64",
          "--layers",       "3",
          "--dataset_size", std::to_string(kDataset),
          "--log_every",    "500",
          "--sample_log",   dir + "/slog"};
}

std::vector<std::string> heal_argv(int nproc, const std::vector<std::string>& launcher,
                                   const std::vector<std::string>& faults,
                                   const std::vector<std::string>& train) {
  std::vector<std::string> argv = {kDdprun, "--nproc_per_node=" + std::to_string(nproc),
                                   "--on_failure=heal", "--max_restarts=4"};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), faults.begin(), faults.end());
  argv.insert(argv.end(), train.begin(), train.end());
  return argv;
}

const std::map<std::string, std::string> kEnv = {{"DDP_TIMEOUT_S", "30"},
                                                 {"DDP_BACKEND", "\x01"},
                                                 {"DDP_DEBUG", "\x01"},
                                                 {"OPENBLAS_NUM_THREADS", "1"}};

HealRun gather(std::vector<std::unique_ptr<Subprocess>>& nodes, const std::string& dir,
               std::chrono::milliseconds timeout) {
  HealRun run{{}, dir};
  run.result.exited = true;
  run.result.code = 0;
  for (auto& node : nodes) {
    const ProcessResult r = node->wait(timeout);
    run.result.exited = run.result.exited && r.exited;
    if (run.result.code == 0) run.result.code = r.code;
    run.result.out += r.out;
    run.result.err += r.err;
  }
  return run;
}

HealRun run_heal(int nproc, const std::vector<std::string>& faults, std::int64_t steps,
                 const std::vector<std::string>& launcher) {
  HealRun run;
  run.dir = make_temp_dir();
  Subprocess p(heal_argv(nproc, launcher, faults, train_args(run.dir, steps)), kEnv);
  run.result = p.wait(120s);
  return run;
}

std::string ledger_problem(const std::string& dir, std::int64_t steps) {
  using Range = std::tuple<std::int64_t, std::int64_t, std::int64_t>;  // epoch, offset, count
  std::vector<std::vector<std::pair<std::int64_t, Range>>> ledgers;    // each process's lines
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("slog.", 0) != 0) continue;
    std::ifstream in(entry.path());
    auto& ledger = ledgers.emplace_back();
    for (std::string line; std::getline(in, line);) {
      std::int64_t s, e, o, n;
      if (std::sscanf(line.c_str(), "step %ld epoch %ld offset %ld count %ld", &s, &e, &o, &n) !=
          4) {
        return "malformed line '" + line + "' in " + entry.path().string();
      }
      ledger.push_back({s, {e, o, n}});
    }
  }
  // A process that died before the end may have finished its last step on
  // its own: on a host lost mid-step, its ranks can receive the last of an
  // all-reduce that the survivors never do, and the survivors redo that
  // step without them. That last line may differ; every other must agree.
  std::map<std::int64_t, Range> by_step;
  std::vector<std::pair<std::int64_t, Range>> last_lines_of_the_dead;
  for (const auto& ledger : ledgers) {
    const bool died = !ledger.empty() && ledger.back().first != steps - 1;
    for (std::size_t i = 0; i < ledger.size(); ++i) {
      if (died && i + 1 == ledger.size()) {
        last_lines_of_the_dead.push_back(ledger[i]);
        continue;
      }
      auto [it, fresh] = by_step.try_emplace(ledger[i].first, ledger[i].second);
      if (!fresh && it->second != ledger[i].second) {
        return "step " + std::to_string(ledger[i].first) +
               " was logged with two different sample ranges";
      }
    }
  }
  for (const auto& [step, range] : last_lines_of_the_dead) by_step.try_emplace(step, range);
  if (by_step.empty() || by_step.rbegin()->first != steps - 1) {
    return "the last committed step logged is not step " + std::to_string(steps - 1);
  }
  std::int64_t epoch = 0, offset = 0;
  for (std::int64_t s = 0; s < steps; ++s) {
    auto it = by_step.find(s);
    if (it == by_step.end()) return "step " + std::to_string(s) + " was never logged";
    const auto [e, o, n] = it->second;
    if (e != epoch || o != offset || n <= 0 || o + n > kDataset) {
      std::ostringstream why;
      why << "step " << s << " took samples [" << o << ", " << o + n << ") of epoch " << e
          << "; the next untrained ones were from " << offset << " of epoch " << epoch;
      return why.str();
    }
    offset += n;
    if (offset == kDataset) {
      ++epoch;
      offset = 0;
    }
  }
  return "";
}

std::map<int, std::pair<std::string, std::int64_t>> checksums(const std::string& out) {
  std::map<int, std::pair<std::string, std::int64_t>> found;
  const std::regex line(R"(\[rank (\d+)\] weights checksum: ([0-9a-f]+) \| committed steps (\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    found[std::stoi((*it)[1])] = {(*it)[2], std::stoll((*it)[3])};
  }
  return found;
}

void expect_healed(const HealRun& run, int nproc, std::int64_t steps) {
  const ProcessResult& r = run.result;
  ASSERT_TRUE(r.exited) << "ddprun did not finish\n" << r.out << r.err;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  const auto sums = checksums(r.out);
  EXPECT_EQ(static_cast<int>(sums.size()), nproc) << r.out;
  for (const auto& [rank, sum] : sums) {
    EXPECT_EQ(sum.first, sums.begin()->second.first) << "rank " << rank << " differs\n" << r.out;
    EXPECT_EQ(sum.second, steps) << "rank " << rank;
  }
  EXPECT_EQ(ledger_problem(run.dir, steps), "");
}

bool dropped(const std::string& out, int id) {
  const std::string n = std::to_string(id);
  return std::regex_search(out, std::regex("left [0-9 ]*\\b" + n + "\\b[0-9 ]*\\|")) ||
         std::regex_search(out, std::regex("replaced [0-9 ]*\\b" + n + "\\b[0-9 ]*\\|"));
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool kill_after_committing(const std::string& dir, int id, int steps) {
  const std::string prefix = "slog." + std::to_string(id) + ".";
  pid_t victim = 0;
  const bool found = wait_until(
      [&] {
        for (const auto& e : std::filesystem::directory_iterator(dir)) {
          const std::string name = e.path().filename().string();
          if (name.rfind(prefix, 0) != 0) continue;
          std::ifstream in(e.path());
          int lines = 0;
          for (std::string line; std::getline(in, line);) ++lines;
          if (lines >= steps) victim = std::stoi(name.substr(prefix.size()));
        }
        return victim != 0;
      },
      60s);
  return found && ::kill(victim, SIGKILL) == 0;
}

std::vector<std::string> with_checkpoints(const std::string& dir, std::vector<std::string> args) {
  for (const char* a : {"--checkpoint_every", "50", "--resume", "auto"}) args.push_back(a);
  args.push_back("--checkpoint");
  args.push_back(dir + "/ckpt");
  return args;
}

std::vector<std::string> sharded_args(const std::string& dir, std::int64_t steps) {
  std::vector<std::string> args = train_args(dir, steps);
  for (const char* a : {"--shard_optimizer", "--optimizer", "adam"}) args.push_back(a);
  return args;
}

}  // namespace ddp::testing
