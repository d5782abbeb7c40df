#include "launch_spec.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "ddp/common/error.h"
#include "failure_report.h"
#include "log_tee.h"
#include "stream_routing.h"

namespace ddp::launcher {
namespace {

LaunchSpec parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  auto outcome = parse_launch_args(args, /*check_program=*/false);
  if (!outcome.spec) throw Error("no spec: " + outcome.message);
  return *outcome.spec;
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(LaunchSpec, BothSpellingsOfEveryMultiWordFlag) {
  EXPECT_EQ(parse({"--nproc_per_node=3", "prog"}).nproc_per_node, 3);
  EXPECT_EQ(parse({"--nproc-per-node", "3", "prog"}).nproc_per_node, 3);
  EXPECT_EQ(parse({"--max-restarts=2", "prog"}).max_restarts, 2);
  EXPECT_DOUBLE_EQ(parse({"--monitor-interval=0.05", "prog"}).monitor_interval_s, 0.05);
  EXPECT_DOUBLE_EQ(parse({"--shutdown-timeout", "1.5", "prog"}).shutdown_timeout_s, 1.5);
}

TEST(LaunchSpec, DefaultsAreTorchrunLikeAndRunIdIsUnique) {
  auto a = parse({"prog"});
  auto b = parse({"prog"});
  EXPECT_EQ(a.nproc_per_node, 1);
  EXPECT_DOUBLE_EQ(a.monitor_interval_s, 0.1);
  EXPECT_EQ(a.max_restarts, 0);
  EXPECT_EQ(a.master_addr, "127.0.0.1");
  EXPECT_FALSE(a.run_id.empty());
  EXPECT_NE(a.run_id, b.run_id);
}

TEST(LaunchSpec, EverythingAfterTheProgramBelongsToIt) {
  auto spec = parse({"--nproc_per_node=2", "prog", "--nproc_per_node=9", "-m", "--", "x"});
  EXPECT_EQ(spec.nproc_per_node, 2);
  EXPECT_EQ(spec.program, "prog");
  EXPECT_EQ(spec.program_args, (std::vector<std::string>{"--nproc_per_node=9", "-m", "--", "x"}));
  EXPECT_EQ(parse({"--", "prog", "a"}).command(), (std::vector<std::string>{"prog", "a"}));
}

TEST(LaunchSpec, PythonProgramsRunUnderPython) {
  EXPECT_EQ(parse({"train.py", "--lr=1"}).command(),
            (std::vector<std::string>{"python3", "-u", "train.py", "--lr=1"}));
  EXPECT_EQ(parse({"-m", "pkg.train", "a"}).command(),
            (std::vector<std::string>{"python3", "-u", "-m", "pkg.train", "a"}));
  EXPECT_EQ(parse({"--no_python", "train.py"}).command(), (std::vector<std::string>{"train.py"}));
}

TEST(LaunchSpec, PetEnvironmentFallbacks) {
  setenv("PET_NPROC_PER_NODE", "5", 1);
  setenv("PET_MAX_RESTARTS", "4", 1);
  auto spec = parse({"prog"});
  auto cli_wins = parse({"--nproc_per_node=2", "prog"});
  unsetenv("PET_NPROC_PER_NODE");
  unsetenv("PET_MAX_RESTARTS");
  EXPECT_EQ(spec.nproc_per_node, 5);
  EXPECT_EQ(spec.max_restarts, 4);
  EXPECT_EQ(cli_wins.nproc_per_node, 2);
}

TEST(LaunchSpec, ErrorsNameTheFlag) {
  EXPECT_NE(error_of({"--bogus", "prog"}).find("unknown option '--bogus'"), std::string::npos);
  EXPECT_NE(error_of({}).find("no program given"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node=0", "p"}).find("--nproc_per_node=0"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node=-1", "p"}).find("--nproc_per_node=-1"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=3:2", "p"}).find("--nnodes=3:2"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=0", "p"}).find("--nnodes=0"), std::string::npos);
  EXPECT_NE(error_of({"--node_rank=1", "p"}).find("--node_rank=1"), std::string::npos);
  EXPECT_NE(error_of({"--master_port=-5", "p"}).find("--master_port=-5"), std::string::npos);
  EXPECT_NE(error_of({"--shutdown_timeout=-1", "p"}).find("--shutdown_timeout"), std::string::npos);
  EXPECT_NE(error_of({"--tee=0:9", "p"}).find("--tee=0:9"), std::string::npos);
  EXPECT_NE(error_of({"--run_id=a/b", "p"}).find("--run_id=a/b"), std::string::npos);
  EXPECT_NE(error_of({"-m", "--no_python", "p"}).find("--no_python"), std::string::npos);
}

TEST(LaunchSpec, ExampleConfigsParse) {
  auto single = parse({"--config", std::string(CONFIGS_DIR) + "/single_node.toml", "prog"});
  EXPECT_EQ(single.nproc_per_node, 4);
  EXPECT_EQ(single.max_restarts, 1);
  EXPECT_EQ(single.tee.for_rank(0), kBoth);
  auto quiet = parse({"--config", std::string(CONFIGS_DIR) + "/quiet_workers.toml", "prog"});
  ASSERT_TRUE(quiet.local_ranks_filter);
  EXPECT_EQ(*quiet.local_ranks_filter, std::vector<int>{0});
}

TEST(Nproc, ResolvesAutoCpuGpu) {
  EXPECT_EQ(resolve_nproc("auto", 0, 6), 6);
  EXPECT_EQ(resolve_nproc("auto", 2, 6), 2);
  EXPECT_EQ(resolve_nproc("cpu", 2, 6), 6);
  EXPECT_EQ(resolve_nproc("gpu", 3, 6), 3);
  EXPECT_THROW(resolve_nproc("gpu", 0, 6), Error);
  EXPECT_EQ(resolve_nproc("12", 0, 1), 12);
}

TEST(StreamRouting, ParsesAllAndPerRankForms) {
  auto all = parse_stream_map("--redirects", "3");
  EXPECT_EQ(all.for_rank(0), kBoth);
  EXPECT_EQ(all.for_rank(7), kBoth);
  auto per = parse_stream_map("--tee", "0:1,2:2");
  EXPECT_EQ(per.for_rank(0), kStdout);
  EXPECT_EQ(per.for_rank(1), kNone);
  EXPECT_EQ(per.for_rank(2), kStderr);
  EXPECT_FALSE(parse_stream_map("--tee", "").any());
  EXPECT_THROW(parse_stream_map("--tee", "4"), Error);
  EXPECT_THROW(parse_stream_map("--tee", "a:1"), Error);
  EXPECT_THROW(parse_stream_map("--tee", "99999999:1"), Error);
}

TEST(LineSplitter, CutsWholeLinesAndKeepsPartialOnesUntilFlush) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto sink = [&](const std::string& l) { lines.push_back(l); };
  splitter.feed("ab", 2, sink);
  EXPECT_TRUE(lines.empty());
  splitter.feed("c\nde\n\nf", 7, sink);
  EXPECT_EQ(lines, (std::vector<std::string>{"abc", "de", ""}));
  splitter.flush(sink);
  EXPECT_EQ(lines.back(), "f");
  std::string nul_line("x\0y", 3);
  splitter.feed((nul_line + "\n").data(), 4, sink);
  EXPECT_EQ(lines.back(), nul_line);
}

TEST(LineSplitter, CutsOverlongLines) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  std::string big(LineSplitter::kMaxLine * 2 + 10, 'x');
  splitter.feed(big.data(), big.size(), [&](const std::string& l) { lines.push_back(l); });
  splitter.flush([&](const std::string& l) { lines.push_back(l); });
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), LineSplitter::kMaxLine);
  EXPECT_EQ(lines[2].size(), 10u);
}

TEST(FailureReport, NamesRankPidCodeAndLastLines) {
  WorkerOutcome o;
  o.rank = 3;
  o.local_rank = 1;
  o.pid = 4242;
  o.code = 9;
  o.signaled = true;
  EXPECT_EQ(o.launcher_exit_code(), 137);
  auto text = format_failure_report(o, {"boom", "bang"}, 0, 2);
  EXPECT_NE(text.find("rank 3 (local rank 1, pid 4242)"), std::string::npos) << text;
  EXPECT_NE(text.find("SIGKILL (9)"), std::string::npos);
  EXPECT_NE(text.find("out-of-memory"), std::string::npos);
  EXPECT_NE(text.find("| boom\n  | bang"), std::string::npos) << text;
  EXPECT_NE(text.find("attempt 1 of 3"), std::string::npos) << text;
  o.signaled = false;
  o.code = 4;
  EXPECT_EQ(o.launcher_exit_code(), 4);
  EXPECT_NE(format_failure_report(o, {}, 0, 0).find("wrote nothing to stderr"), std::string::npos);
}

}  // namespace
}  // namespace ddp::launcher
