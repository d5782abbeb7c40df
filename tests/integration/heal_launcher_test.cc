// The launcher side of live recovery, `ddprun --on_failure=heal`: the flag,
// what heal decides (pure), and real ddprun runs of small bash workers that
// opt in themselves by touching $DDP_HEAL_MARK (as libddp does for a program
// that uses its healing API), die or hang, and record each launch.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "agent/heal_policy.h"
#include "run_ddprun.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
using launcher::heal_step;
using launcher::heal_takes_hang;
using launcher::HealStep;
using launcher::WorkerOutcome;
const std::string kDdprun = DDPRUN_PATH;

// --- What heal decides (pure) ---

WorkerOutcome outcome(int rank, bool signaled, int code) {
  WorkerOutcome o;
  o.rank = rank;
  o.local_rank = rank;
  o.signaled = signaled;
  o.code = code;
  return o;
}

TEST(HealPolicy, ARankIsRelaunchedOnlyWhenItOptedInAndARestartIsLeft) {
  EXPECT_EQ(heal_step(true, 1), HealStep::kRelaunch);
  EXPECT_EQ(heal_step(true, 0), HealStep::kAsRestart);
  EXPECT_EQ(heal_step(false, 3), HealStep::kAsRestart);
  EXPECT_EQ(heal_step(false, 0), HealStep::kAsRestart);
}

TEST(HealPolicy, AHangIsHealedWhenEveryBlamedRankOptedInAndSomeRankIsNotBlamed) {
  EXPECT_TRUE(heal_takes_hang(1, 1, 4, 1));
  EXPECT_TRUE(heal_takes_hang(2, 2, 4, 2));
  EXPECT_FALSE(heal_takes_hang(2, 2, 4, 1)) << "a restart is needed for each blamed rank";
  EXPECT_FALSE(heal_takes_hang(2, 1, 4, 5)) << "a blamed rank that did not opt in";
  EXPECT_FALSE(heal_takes_hang(4, 4, 4, 5)) << "nobody left to heal from";
  EXPECT_FALSE(heal_takes_hang(0, 0, 4, 5));
  EXPECT_FALSE(heal_takes_hang(1, 1, 2, 0));
}

TEST(HealPolicy, TheLinesNameTheRankHowItEndedAndTheBudget) {
  EXPECT_EQ(launcher::relaunch_line(outcome(2, true, 9), 1, 3),
            "rank 2 (local rank 2) exited with signal 9 (SIGKILL): relaunching it (relaunch 1 of "
            "3); the other ranks go on");
  EXPECT_EQ(launcher::relaunch_line(outcome(0, false, 3), 2, 2),
            "rank 0 (local rank 0) exited with exit code 3: relaunching it (relaunch 2 of 2); the "
            "other ranks go on");
  WorkerOutcome hung = outcome(1, true, 9);
  hung.hung = true;
  EXPECT_EQ(launcher::how_it_ended(hung), "made no progress for --hang_timeout and was killed");
  EXPECT_EQ(launcher::not_opted_in_line(outcome(2, false, 1), 1),
            "rank 2 had not opted into healing (libddp's healing API); restarting the group as "
            "--on_failure=restart would");
  EXPECT_EQ(launcher::not_opted_in_line(outcome(2, false, 1), 0),
            "rank 2 had not opted into healing (libddp's healing API); handling its failure as "
            "--on_failure=restart would");
}

// --- ddprun with bash workers ---

// Each launch appends "RANK INCARNATION PID RESTART_COUNT ON_FAILURE STALE MARK"
// to $HEAL_TEST_DIR/record (STALE: the mark existed before the worker
// started), prints "hello from rank R incarnation I", then acts by
// $HEAL_TEST_MODE. Waits are bounded (exit 3 after 20 s).
// clang-format off
const char* kWorkerScript = R"SH(#!/bin/bash
d="$HEAL_TEST_DIR"
inc="${DDP_INCARNATION:-none}"
stale=0
if [ -n "$DDP_HEAL_MARK" ] && [ -e "$DDP_HEAL_MARK" ]; then stale=1; fi
echo "$RANK $inc $$ $TORCHELASTIC_RESTART_COUNT ${DDP_ON_FAILURE:-none} $stale ${DDP_HEAL_MARK:-none}" >> "$d/record"
echo "hello from rank $RANK incarnation $inc"
end=$((SECONDS + 20))
wait_for() { while [ ! -e "$1" ]; do [ $SECONDS -ge $end ] && exit 3; sleep 0.02; done; }
wait_lines() { while [ "$(wc -l < "$d/record")" -lt "$1" ]; do [ $SECONDS -ge $end ] && exit 3; sleep 0.02; done; }
case "$HEAL_TEST_MODE" in
  kill)  # every rank opts in; rank 1 kills itself at its first launch, once all have started
    touch "$DDP_HEAL_MARK"
    if [ "$RANK" = 1 ]; then
      if [ "$inc" = 0 ]; then wait_lines "$WORLD_SIZE"; kill -KILL $$; fi
      touch "$d/healed"; exit 0
    fi
    wait_for "$d/healed" ;;
  always)  # rank 1 opts in and fails at every launch; the others wait
    touch "$DDP_HEAL_MARK"
    if [ "$RANK" = 1 ]; then echo "rank 1 gives up" >&2; exit 7; fi
    wait_for "$d/never" ;;
  no-opt-in)  # nobody opts in; rank 1 kills itself in the first attempt
    if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
      if [ "$RANK" = 1 ]; then wait_lines "$WORLD_SIZE"; kill -KILL $$; fi
      wait_for "$d/never"
    fi ;;
  stop)  # rank 1 opts in and stops itself at its first launch; rank 0 spins (CPU: progress)
    touch "$DDP_HEAL_MARK"
    if [ "$RANK" = 1 ]; then
      if [ "$inc" = 0 ]; then kill -STOP $$; fi
      touch "$d/healed"; exit 0
    fi
    while [ ! -e "$d/healed" ]; do [ $SECONDS -ge $end ] && exit 3; done ;;
  env) ;;
esac
exit 0
)SH";
// clang-format on

// A Python worker for the hang test: Python ranks answer the hang's SIGABRT
// with a traceback dump and end before ddprun kills them. Rank 1 opts in and
// stops itself at its first launch; the others spin (CPU time: progress).
const char* kPythonWorker = R"PY(import os, pathlib, signal, time
d, inc = os.environ["HEAL_TEST_DIR"], os.environ["DDP_INCARNATION"]
with open(d + "/record", "a") as f:
    f.write(f"{os.environ['RANK']} {inc} {os.getpid()} 0 {os.environ['DDP_ON_FAILURE']} 0 x\n")
pathlib.Path(os.environ["DDP_HEAL_MARK"]).touch()
if os.environ["RANK"] == "1":
    if inc == "0":
        os.kill(os.getpid(), signal.SIGSTOP)
    pathlib.Path(d + "/healed").touch()
else:
    end = time.time() + 20
    while not os.path.exists(d + "/healed"):
        if time.time() > end:
            raise SystemExit(3)
)PY";

struct Launch {
  int rank = 0;
  std::string incarnation;
  long pid = 0;
  std::string restart_count, on_failure, mark;
  bool stale_mark = false;
};

class HealLauncher : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    script_ = dir_ + "/worker.sh";
    write_file(script_, kWorkerScript);
    ASSERT_EQ(chmod(script_.c_str(), 0755), 0);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  ProcessResult launch(const std::string& mode, std::vector<std::string> flags,
                       std::map<std::string, std::string> env = {}) {
    flags.push_back(script_);
    env["HEAL_TEST_DIR"] = dir_;
    env["HEAL_TEST_MODE"] = mode;
    return ddprun(flags, env, 40s);
  }

  std::vector<Launch> launches() const {
    std::vector<Launch> all;
    std::istringstream lines(read_file(dir_ + "/record"));
    for (std::string line; std::getline(lines, line);) {
      std::istringstream fields(line);
      Launch l;
      int stale = 0;
      fields >> l.rank >> l.incarnation >> l.pid >> l.restart_count >> l.on_failure >> stale >>
          l.mark;
      l.stale_mark = stale != 0;
      all.push_back(l);
    }
    return all;
  }
  static std::vector<Launch> of_rank(const std::vector<Launch>& all, int rank) {
    std::vector<Launch> mine;
    for (const auto& l : all) {
      if (l.rank == rank) mine.push_back(l);
    }
    return mine;
  }

  std::string dir_, script_;
};

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST_F(HealLauncher, AnOptedInRankKilledBySigkillIsRelaunchedAloneAndTheJobSucceeds) {
  const std::string logs = dir_ + "/logs";
  auto r = launch("kill", {"--nproc_per_node=3", "--on_failure=heal", "--max_restarts=3",
                           "--run_id=healjob", "--log_dir=" + logs});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "rank 1 (local rank 1) exited with signal 9 (SIGKILL): relaunching it "
                       "(relaunch 1 of 3); the other ranks go on"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "restarting the worker group")) << r.err;
  const auto all = launches();
  ASSERT_EQ(all.size(), 4u) << read_file(dir_ + "/record");
  for (int rank : {0, 2}) {
    const auto mine = of_rank(all, rank);
    ASSERT_EQ(mine.size(), 1u) << "rank " << rank << " was started again";
    EXPECT_EQ(mine[0].incarnation, "0");
  }
  const auto one = of_rank(all, 1);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[0].incarnation, "0");
  EXPECT_EQ(one[1].incarnation, "1");
  EXPECT_NE(one[0].pid, one[1].pid);
  for (const auto& l : all) {
    EXPECT_EQ(l.on_failure, "heal");
    EXPECT_EQ(l.restart_count, "0") << "a relaunch is not a group restart";
    EXPECT_FALSE(l.stale_mark) << "rank " << l.rank << " incarnation " << l.incarnation;
  }
  EXPECT_EQ(one[0].mark, one[1].mark);
  EXPECT_NE(one[0].mark, of_rank(all, 0)[0].mark) << "one mark per local rank";
  // The run's mark directory is gone with ddprun.
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(one[0].mark).parent_path()));
  // The relaunched rank's console lines keep their prefix, and its log file
  // goes on after the first incarnation's lines.
  EXPECT_TRUE(contains(r.out, "[rank 1] hello from rank 1 incarnation 1")) << r.out;
  const std::string log = read_file(run_dir(logs, "healjob") + "/attempt_0/1/stdout.log");
  EXPECT_EQ(log, "hello from rank 1 incarnation 0\nhello from rank 1 incarnation 1\n");
}

TEST_F(HealLauncher, ARankFailingAgainIsRelaunchedUntilTheBudgetIsSpentThenTheJobFails) {
  auto r = launch("always", {"--nproc_per_node=3", "--on_failure=heal", "--max_restarts=2",
                             "--shutdown_timeout=5"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 7) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "rank 1 (local rank 1) exited with exit code 7: relaunching it "
                       "(relaunch 1 of 2)"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "(relaunch 2 of 2)")) << r.err;
  EXPECT_TRUE(contains(r.err, "worker failed: rank 1 (local rank 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 gives up")) << r.err;
  const auto one = of_rank(launches(), 1);
  ASSERT_EQ(one.size(), 3u);
  for (size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k].incarnation, std::to_string(k));
  EXPECT_EQ(of_rank(launches(), 0).size(), 1u);
  EXPECT_EQ(of_rank(launches(), 2).size(), 1u);
}

TEST_F(HealLauncher, WithNoRestartLeftARankIsNotRelaunchedAndTheJobFailsAsToday) {
  auto r = launch("kill", {"--nproc_per_node=3", "--on_failure=heal", "--max_restarts=0",
                           "--shutdown_timeout=5"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 128 + 9) << r.err;
  EXPECT_FALSE(contains(r.err, "relaunching")) << r.err;
  EXPECT_TRUE(contains(r.err, "worker failed: rank 1 (local rank 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
  const auto all = launches();
  ASSERT_EQ(all.size(), 3u) << read_file(dir_ + "/record");
  // The mark directory is removed on failure too.
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(all[0].mark).parent_path()));
}

TEST_F(HealLauncher, ARankThatDidNotOptInRestartsTheWholeGroupWithTheNotice) {
  auto r = launch("no-opt-in", {"--nproc_per_node=3", "--on_failure=heal", "--max_restarts=1",
                                "--shutdown_timeout=5"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "rank 1 had not opted into healing (libddp's healing API); restarting the "
                       "group as --on_failure=restart would"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "restarting the worker group (restart 1 of 1)")) << r.err;
  EXPECT_FALSE(contains(r.err, "relaunching")) << r.err;
  const auto all = launches();
  ASSERT_EQ(all.size(), 6u) << read_file(dir_ + "/record");
  for (int rank = 0; rank < 3; ++rank) {
    const auto mine = of_rank(all, rank);
    ASSERT_EQ(mine.size(), 2u);
    EXPECT_NE(mine[0].pid, mine[1].pid) << "rank " << rank << " was not restarted";
    EXPECT_EQ(mine[0].restart_count, "0");
    EXPECT_EQ(mine[1].restart_count, "1");
    EXPECT_EQ(mine[1].incarnation, "0");
  }
}

TEST_F(HealLauncher, AHungRankThatOptedInIsKilledAndRelaunchedAndTheJobSucceeds) {
  auto r = launch("stop", {"--nproc_per_node=2", "--on_failure=heal", "--max_restarts=1",
                           "--hang_timeout=1", "--shutdown_timeout=5"});
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "worker group hung (no progress for 1 s, --hang_timeout): rank 1"))
      << r.err;
  EXPECT_TRUE(contains(r.err,
                       "rank 1 (local rank 1) made no progress for --hang_timeout and was killed: "
                       "relaunching it (relaunch 1 of 1); the other ranks go on"))
      << r.err;
  const auto all = launches();
  ASSERT_EQ(of_rank(all, 0).size(), 1u) << read_file(dir_ + "/record");
  const auto one = of_rank(all, 1);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[1].incarnation, "1");
}

TEST_F(HealLauncher, AHungPythonRankIsRelaunchedAfterItsTracebackAndTheOthersLiveOn) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  write_file(dir_ + "/worker.py", kPythonWorker);
  auto r = run_process({kDdprun, "--nproc_per_node=3", "--on_failure=heal", "--max_restarts=1",
                        "--hang_timeout=1", "--shutdown_timeout=5", dir_ + "/worker.py"},
                       {{"HEAL_TEST_DIR", dir_}, {"DDP_PYTHON", "/usr/bin/python3"}}, 40s);
  ASSERT_TRUE(r.exited);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1, Python traceback (faulthandler):")) << r.err;
  EXPECT_TRUE(contains(r.err, "relaunching it (relaunch 1 of 1)")) << r.err;
  const auto all = launches();
  EXPECT_EQ(of_rank(all, 0).size(), 1u) << "a waiting rank was aborted too";
  EXPECT_EQ(of_rank(all, 2).size(), 1u) << "a waiting rank was aborted too";
  ASSERT_EQ(of_rank(all, 1).size(), 2u) << read_file(dir_ + "/record");
  EXPECT_EQ(of_rank(all, 1)[1].incarnation, "1");
}

TEST_F(HealLauncher, TheFlagItsVariableAndItsConfigKeyTurnHealOn) {
  write_file(dir_ + "/job.toml", "on_failure = \"heal\"\n");
  const std::vector<std::vector<std::string>> ways = {
      {"--on_failure=heal"}, {"--on-failure", "heal"}, {"--config", dir_ + "/job.toml"}};
  for (const auto& way : ways) {
    std::filesystem::remove(dir_ + "/record");
    auto flags = way;
    flags.push_back("--nproc_per_node=2");
    auto r = launch("env", flags);
    ASSERT_EQ(r.code, 0) << way[0] << ": " << r.err;
    for (const auto& l : launches()) {
      EXPECT_EQ(l.on_failure, "heal") << way[0];
      EXPECT_EQ(l.incarnation, "0") << way[0];
    }
  }
  std::filesystem::remove(dir_ + "/record");
  auto r = launch("env", {"--nproc_per_node=1"}, {{"PET_ON_FAILURE", "heal"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(launches().at(0).on_failure, "heal");
  // The default: none of heal's variables.
  std::filesystem::remove(dir_ + "/record");
  r = launch("env", {"--nproc_per_node=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(launches().at(0).on_failure, "none");
  EXPECT_EQ(launches().at(0).incarnation, "none");
  EXPECT_EQ(launches().at(0).mark, "none");
}

TEST_F(HealLauncher, ABadValueIsAnErrorNamingTheFlagAndStartsNothing) {
  for (const auto& [flags, env] :
       std::vector<std::pair<std::vector<std::string>, std::map<std::string, std::string>>>{
           {{"--on_failure=x"}, {}}, {{}, {{"PET_ON_FAILURE", "x"}}}}) {
    auto r = launch("env", flags, env);
    ASSERT_TRUE(r.exited);
    EXPECT_EQ(r.code, 2) << r.err;
    // Named as the user wrote it: the flag, or the variable.
    const std::string named = env.empty() ? "--on_failure=x" : "PET_ON_FAILURE=x";
    EXPECT_TRUE(contains(r.err, named + ": expected restart or heal")) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/record"));
  }
}

}  // namespace
}  // namespace ddp::testing
