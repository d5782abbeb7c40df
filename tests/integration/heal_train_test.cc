// Live recovery end to end: ddprun --on_failure=heal running the reference
// trainer (heal_fault_worker: train with faults to inject) on one node, with
// ranks killed with SIGKILL mid-step, between steps, two at once and during
// a heal, and a rank hung with SIGSTOP. Each run must end with exit 0, every
// rank holding the same weights (equal checksums), the asked-for number of
// committed steps, and every sample of every epoch in exactly one committed
// step (the --sample_log ledger every process writes).

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "elastic_plan.h"
#include "netns_hosts.h"
#include "netns_test.h"
#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;
const std::string kWorker = HEAL_FAULT_WORKER_PATH;
// 514 samples: with 4 ranks of 32 the last step of each epoch has 2 samples
// for 4 slices, so some ranks contribute an empty slice.
constexpr std::int64_t kDataset = 514;

struct HealRun {
  ProcessResult result;
  std::string dir;  // where the sample logs are
};

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

HealRun run_heal(int nproc, const std::vector<std::string>& faults, std::int64_t steps,
                 const std::vector<std::string>& launcher = {}) {
  HealRun run;
  run.dir = make_temp_dir();
  Subprocess p(heal_argv(nproc, launcher, faults, train_args(run.dir, steps)), kEnv);
  run.result = p.wait(120s);
  return run;
}

// The ledger: every process's committed steps. "" when steps 0..steps-1
// each appear with one (epoch, offset, count), and in order they tile every
// epoch exactly; else the first problem.
std::string ledger_problem(const std::string& dir, std::int64_t steps) {
  std::map<std::int64_t, std::tuple<std::int64_t, std::int64_t, std::int64_t>> by_step;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("slog.", 0) != 0) continue;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      std::int64_t s, e, o, n;
      if (std::sscanf(line.c_str(), "step %ld epoch %ld offset %ld count %ld", &s, &e, &o, &n) !=
          4) {
        return "malformed line '" + line + "' in " + entry.path().string();
      }
      auto [it, fresh] = by_step.try_emplace(s, e, o, n);
      if (!fresh && it->second != std::make_tuple(e, o, n)) {
        return "step " + std::to_string(s) + " was logged with two different sample ranges";
      }
    }
  }
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

// "[rank K] weights checksum: X | committed steps S | ..." -> K -> (X, S)
std::map<int, std::pair<std::string, std::int64_t>> checksums(const std::string& out) {
  std::map<int, std::pair<std::string, std::int64_t>> found;
  const std::regex line(R"(\[rank (\d+)\] weights checksum: ([0-9a-f]+) \| committed steps (\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    found[std::stoi((*it)[1])] = {(*it)[2], std::stoll((*it)[3])};
  }
  return found;
}

// Exit 0, `nproc` ranks ending with one checksum and `steps` committed steps,
// and a ledger without a lost or repeated sample.
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

// Whether rank `id` dropped out of some epoch: left, or already replaced by
// its relaunch when the survivors' reform admitted it at once.
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

// SIGKILLs the process of rank `id` from outside, mid-step, once it has
// committed `steps` steps (its own ledger, slog.ID.PID, names its pid).
// False when that does not happen within a minute.
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

TEST(HealTrain, ARankKilledBetweenStepsIsReplacedAndTheRunLosesNothing) {
  const auto run = run_heal(4, {"--kill", "3@150"}, 2500);
  expect_healed(run, 4, 2500);
  const std::string& out = run.result.out;
  // Either the survivors go on with three ranks and admit the relaunch later,
  // or (a loaded machine) the relaunch arrives before they close the epoch.
  const bool left_then_arrived =
      out.find("left 3 | arrived none | replaced none | world 4 -> 3") != std::string::npos &&
      out.find("left none | arrived 3 | replaced none | world 3 -> 4") != std::string::npos;
  const bool replaced =
      out.find("left none | arrived none | replaced 3 | world 4 -> 4") != std::string::npos;
  EXPECT_TRUE(left_then_arrived || replaced) << out;
  EXPECT_NE(out.find("[rank 3] heal: joined epoch"), std::string::npos) << out;
  EXPECT_NE(
      run.result.err.find("rank 3 (local rank 3) exited with signal 9 (SIGKILL): relaunching"),
      std::string::npos)
      << run.result.err;
}

TEST(HealTrain, ARelaunchWaitingWhenTheSurvivorsShrankIsAdmittedBeforeTheyBuildAGradSync) {
  // Rank 3 dies after step 150; its relaunch starts 300 ms late, after the
  // survivors closed the epoch of three, and asks to be admitted while they
  // still linger after that reform. They admit it at once: no GradSync is
  // ever built over the three of them (its construction logs "3 ranks").
  const auto run = run_heal(
      4, {"--kill", "3@150", "--relaunch_delay", "300", "--linger_after_reform", "2000"}, 600);
  expect_healed(run, 4, 600);
  const std::string& out = run.result.out;
  const auto shrank = out.find("left 3 | arrived none | replaced none | world 4 -> 3");
  const auto grew = out.find("left none | arrived 3 | replaced none | world 3 -> 4");
  ASSERT_NE(shrank, std::string::npos) << out;
  ASSERT_NE(grew, std::string::npos) << out;
  EXPECT_NE(out.find(" 4 ranks, communication"), std::string::npos) << out;  // what is searched for
  EXPECT_EQ(out.find(" 3 ranks, communication"), std::string::npos) << out;
}

TEST(HealTrain, ARelaunchAsksToBeAdmittedWhileItAllocatesItsModel) {
  // Rank 3 dies after step 150; the survivors wait 1.5 s before they reform
  // and its relaunch takes 4 s to allocate its model. The relaunch asks to be
  // admitted before that allocation, so the survivors' first reform replaces
  // rank 3 at once (they then wait for its model in the state exchange)
  // instead of going on with three ranks and admitting it seconds later.
  const auto run = run_heal(
      4, {"--kill", "3@150", "--linger_before_reform", "1500", "--relaunch_model_delay", "4000"},
      600);
  expect_healed(run, 4, 600);
  const std::string& out = run.result.out;
  EXPECT_NE(out.find("left none | arrived none | replaced 3 | world 4 -> 4"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("world 4 -> 3"), std::string::npos) << out;
  EXPECT_EQ(count_of(out, "heal: epoch "), 3u) << out;  // one reform, one line per survivor
}

TEST(HealTrain, ARankKilledMidStepFromOutsideIsReplaced) {
  const std::string dir = make_temp_dir();
  Subprocess p(heal_argv(3, {}, {}, train_args(dir, 4000)), kEnv);
  ASSERT_TRUE(kill_after_committing(dir, 1, 300));
  HealRun run{p.wait(120s), dir};
  expect_healed(run, 3, 4000);
  EXPECT_TRUE(dropped(run.result.out, 1)) << run.result.out;
}

// --comm_mode shared (no collectives: the ranks add their gradients into one
// node-shared buffer) heals too: a rank killed between steps, and another
// killed from outside mid-step (while the others may be waiting on its
// blocks of the shared sum), are replaced; the sum is rebuilt in each new
// epoch's shared segment.
TEST(HealTrain, UnderCommModeSharedKilledRanksAreReplaced) {
  const std::string dir = make_temp_dir();
  std::vector<std::string> args = train_args(dir, 4000);
  for (const char* a : {"--comm_mode", "shared"}) args.push_back(a);
  Subprocess p(heal_argv(3, {}, {"--kill", "2@150"}, args), kEnv);
  ASSERT_TRUE(kill_after_committing(dir, 1, 400));
  HealRun run{p.wait(120s), dir};
  expect_healed(run, 3, 4000);
  EXPECT_TRUE(dropped(run.result.out, 1) && dropped(run.result.out, 2)) << run.result.out;
  EXPECT_NE(run.result.out.find("SharedGradSum:"), std::string::npos) << run.result.out;
  EXPECT_EQ(run.result.out.find("cannot heal in process"), std::string::npos) << run.result.out;
}

TEST(HealTrain, TwoRanksKilledAtOnceAreBothReplaced) {
  const auto run = run_heal(4, {"--kill", "1@200", "--kill", "2@200"}, 2500);
  expect_healed(run, 4, 2500);
  EXPECT_TRUE(dropped(run.result.out, 1) && dropped(run.result.out, 2)) << run.result.out;
}

TEST(HealTrain, ARankKilledDuringAHealIsLeftOutOfTheNextEpochAndReplaced) {
  // Rank 3 dies after step 150; rank 1 dies right after the survivors
  // rebuilt the group, while they exchange state.
  const auto run = run_heal(4, {"--kill", "3@150", "--die_in_heal", "1"}, 2500);
  expect_healed(run, 4, 2500);
  const std::string& out = run.result.out;
  EXPECT_TRUE(dropped(out, 1)) << out;
  EXPECT_GE(count_of(run.result.err, "relaunching it"), 2u) << run.result.err;
}

TEST(HealTrain, AHungRankIsKilledByTheHangTimeoutAndHealed) {
  const auto run = run_heal(3, {"--stop", "2@150"}, 2500, {"--hang_timeout=2"});
  expect_healed(run, 3, 2500);
  // The relaunch may be admitted in the very reform that drops the hung process.
  EXPECT_TRUE(dropped(run.result.out, 2)) << run.result.out;
}

// `args` with a checkpoint every 50 steps in DIR/ckpt, resumed from on a restart.
std::vector<std::string> with_checkpoints(const std::string& dir, std::vector<std::string> args) {
  for (const char* a : {"--checkpoint_every", "50", "--resume", "auto"}) args.push_back(a);
  args.push_back("--checkpoint");
  args.push_back(dir + "/ckpt");
  return args;
}

TEST(HealTrain, AHealThatCannotFinishRestartsTheGroupFromTheCheckpoint) {
  // Rank 1 dies after step 120; rank 0, the only holder of the state, dies
  // while it rebuilds the group. Their relaunches hold nothing: they give up
  // the heal, ddprun restarts the group, and it resumes from the checkpoint
  // of step 100.
  const std::string dir = make_temp_dir();
  const std::vector<std::string> args = with_checkpoints(dir, train_args(dir, 400));
  Subprocess p(heal_argv(2, {}, {"--kill", "1@120", "--die_in_heal", "0"}, args), kEnv);
  HealRun run{p.wait(120s), dir};
  expect_healed(run, 2, 400);
  const std::string all = run.result.out + run.result.err;
  EXPECT_NE(all.find("no live member holds the training state"), std::string::npos) << all;
  EXPECT_NE(all.find("restarting the group"), std::string::npos) << all;
  EXPECT_NE(all.find("resumed from " + dir + "/ckpt at step 100"), std::string::npos) << all;
}

// --shard_optimizer heals: each rank also updates the optimizer shard of the
// rank half the world further on, so a dead rank's shard comes from that
// replica. Adam (two state
// buffers and a step count) makes a lost or stale shard change the weights.
std::vector<std::string> sharded_args(const std::string& dir, std::int64_t steps) {
  std::vector<std::string> args = train_args(dir, steps);
  for (const char* a : {"--shard_optimizer", "--optimizer", "adam"}) args.push_back(a);
  return args;
}

TEST(HealTrain, UnderShardOptimizerAReplacedRanksShardComesFromItsReplicaBitForBit) {
  // Rank 3 dies before its update of step 151, once the gradients are
  // averaged: the others update their shards but cannot finish the step, so
  // they take their updates back and redo it. Its relaunch takes its place at
  // once (the survivors linger before they reform): the same four ranks and
  // the same data split throughout, so the weights must equal a fault-free
  // run's.
  const std::string clean_dir = make_temp_dir(), dir = make_temp_dir();
  HealRun clean{Subprocess(heal_argv(4, {}, {}, sharded_args(clean_dir, 600)), kEnv).wait(120s),
                clean_dir};
  expect_healed(clean, 4, 600);
  HealRun run{Subprocess(heal_argv(4, {},
                                   {"--kill_before_update", "3@151", "--linger_before_reform",
                                    "1500", "--relaunch_model_delay", "4000"},
                                   sharded_args(dir, 600)),
                         kEnv)
                  .wait(120s),
              dir};
  expect_healed(run, 4, 600);
  const std::string& out = run.result.out;
  EXPECT_NE(out.find("replaced 3 | world 4 -> 4"), std::string::npos) << out;
  EXPECT_NE(out.find("| optimizer shards restored first: "), std::string::npos) << out;
  ASSERT_FALSE(checksums(clean.result.out).empty());
  ASSERT_FALSE(checksums(out).empty());
  EXPECT_EQ(checksums(out).begin()->second.first, checksums(clean.result.out).begin()->second.first)
      << "the healed run's weights differ from the fault-free run's\n"
      << out;
}

TEST(HealTrain, UnderShardOptimizerRanksKilledMidStepAndTwoAtOnceAreReplaced) {
  // Ranks 1 and 2 die together after step 150 (their replicas are on ranks
  // 3 and 0); rank 3 is then killed from outside mid-step, when some ranks
  // may have updated their shards for a step nobody finished.
  const std::string dir = make_temp_dir();
  Subprocess p(heal_argv(4, {}, {"--kill", "1@150", "--kill", "2@150"}, sharded_args(dir, 3000)),
               kEnv);
  ASSERT_TRUE(kill_after_committing(dir, 3, 400));
  HealRun run{p.wait(120s), dir};
  expect_healed(run, 4, 3000);
  const std::string& out = run.result.out;
  EXPECT_TRUE(dropped(out, 1) && dropped(out, 2) && dropped(out, 3)) << out;
  EXPECT_EQ(out.find("cannot heal in process"), std::string::npos) << out;
}

TEST(HealTrain, UnderShardOptimizerLosingAShardAndItsReplicaRestartsFromTheCheckpoint) {
  // Ranks 1 and 3 die together after step 120: rank 1's shard and its
  // replica (on rank 3) are both gone. The heal cannot finish; ddprun
  // restarts the group, which resumes from the checkpoint of step 100.
  const std::string dir = make_temp_dir();
  const std::vector<std::string> args = with_checkpoints(dir, sharded_args(dir, 400));
  Subprocess p(heal_argv(4, {}, {"--kill", "1@120", "--kill", "3@120"}, args), kEnv);
  HealRun run{p.wait(120s), dir};
  expect_healed(run, 4, 400);
  const std::string all = run.result.out + run.result.err;
  EXPECT_NE(all.find("the sharded state of old rank 1 of 4 is held by no live member (it and old "
                     "rank 3, which kept its replica, both left)"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("restarting the group"), std::string::npos) << all;
  EXPECT_NE(all.find("resumed from " + dir + "/ckpt at step 100"), std::string::npos) << all;
}

class HealMultiHost : public NetnsTest {};

// ddprun's flags for namespace hosts that find each other through a c10d
// rendezvous on the first, with fast liveness (a host lost in 2 s).
std::vector<std::string> hosts_launcher(const NetnsHosts& hosts, const std::string& nnodes,
                                        const std::string& run_id,
                                        const std::string& more_conf = "") {
  return {"--nnodes=" + nnodes, "--rdzv_backend=c10d",
          "--rdzv_endpoint=" + hosts.address(0) + ":29400", "--rdzv_id=" + run_id,
          "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20" + more_conf};
}

TEST_F(HealMultiHost, ARankKilledOnTheSecondHostIsReplacedAndEveryHostGoesOn) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "2", "heal2");
  // The model is small: stripes of 1 KiB, so that it is striped all the same.
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_STRIPE_MB"] = "0.001";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    nodes.push_back(std::make_unique<Subprocess>(
        hosts.on(h, heal_argv(2, launcher, {"--kill", "3@150"}, train_args(dir, 2500))), env));
  }
  HealRun run{{}, dir};
  run.result.exited = true;
  run.result.code = 0;
  for (auto& node : nodes) {
    const ProcessResult r = node->wait(120s);
    ASSERT_TRUE(r.exited) << r.out << r.err;
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    run.result.out += r.out;
    run.result.err += r.err;
  }
  expect_healed(run, 4, 2500);
  EXPECT_TRUE(dropped(run.result.out, 3)) << run.result.out;
  // The group spans two hosts: the three holders each sent a share of the
  // state to the relaunch (the checksums above show the shares fit).
  EXPECT_NE(run.result.out.find("MB from ranks 0 1 2 (striped)"), std::string::npos)
      << run.result.out;
  EXPECT_NE(
      run.result.err.find("rank 3 (local rank 1) exited with signal 9 (SIGKILL): relaunching"),
      std::string::npos)
      << run.result.err;
}

// A whole host lost mid-run (its agent and workers SIGKILLed): two hosts of
// 2 ranks train with `args` and host 1 is lost; the rendezvous (on host 0)
// leaves the node out of the running round (--nnodes=1:2 allows one node),
// the survivors drop the lost ranks after HealOptions::wait and finish the
// run on their own, losing no committed step or sample. `out`: host 0's
// output.
void lose_a_whole_host(const std::function<std::vector<std::string>(const std::string&)>& args,
                       std::string& out) {
  NetnsHosts hosts(2);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "1:2", "heal-lost");
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_WAIT_S"] = "2";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    nodes.push_back(
        std::make_unique<Subprocess>(hosts.on(h, heal_argv(2, launcher, {}, args(dir))), env));
  }
  // Both hosts train (rank 0 has logged its first steps), then host 1 is lost.
  ASSERT_TRUE(
      wait_until([&] { return nodes[0]->read_out().find("step ") != std::string::npos; }, 60s))
      << nodes[0]->read_out() << nodes[0]->read_err();
  hosts.kill_everything_on(1);
  const ProcessResult lost = nodes[1]->wait(10s);
  ASSERT_TRUE(lost.exited);
  EXPECT_TRUE(lost.signaled);

  HealRun run{nodes[0]->wait(120s), dir};
  expect_healed(run, 2, 4000);
  EXPECT_TRUE(dropped(run.result.out, 2) && dropped(run.result.out, 3)) << run.result.out;
  EXPECT_NE(run.result.err.find("stopped sending heartbeats"), std::string::npos) << run.result.err;
  EXPECT_NE(run.result.err.find("left out of round 1 (--on_failure=heal); 1 node(s) go on"),
            std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("joining the next round"), std::string::npos) << run.result.err;
  out = run.result.out;
}

TEST_F(HealMultiHost, AWholeHostLostMidRunIsLeftOutAndTheOtherHostFinishes) {
  std::string out;
  lose_a_whole_host([](const std::string& dir) { return train_args(dir, 4000); }, out);
}

// Ranks 2 and 3 go together: their optimizer shards' replicas are on the
// other host (ranks 0 and 1), which restores them and finishes alone.
TEST_F(HealMultiHost, UnderShardOptimizerAWholeHostLostMidRunLosesNoOptimizerState) {
  std::string out;
  lose_a_whole_host([](const std::string& dir) { return sharded_args(dir, 4000); }, out);
  EXPECT_NE(out.find("| optimizer shards restored first: "), std::string::npos) << out;
}

// With the rendezvous on a machine that does not train (`ddprun rendezvous
// --on_failure=heal`, as torchrun users keep etcd apart), any training host
// may be lost, the one running rank 0 included: the other host's ranks
// become ranks 0 and 1 of the next epoch and finish the run.
TEST_F(HealMultiHost, WithTheRendezvousApartTheHostOfRankZeroMayBeLost) {
  NetnsHosts hosts(3);
  const std::string dir = make_temp_dir();
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_WAIT_S"] = "2";
  const std::string conf = "--rdzv_conf=heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20";
  Subprocess server(
      hosts.on(2, {kDdprun, "rendezvous", "--port=29400", "--host=" + hosts.address(2),
                   "--run_id=heal-apart", "--nnodes=1:2", "--on_failure=heal", conf}),
      env);
  ASSERT_TRUE(
      wait_until([&] { return server.read_out().find("listening on") != std::string::npos; }, 10s))
      << server.read_out() << server.read_err();
  const std::vector<std::string> launcher = {"--nnodes=1:2", "--rdzv_backend=c10d",
                                             "--rdzv_endpoint=" + hosts.address(2) + ":29400",
                                             "--rdzv_id=heal-apart", conf};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int h = 0; h < 2; ++h) {
    nodes.push_back(std::make_unique<Subprocess>(
        hosts.on(h, heal_argv(2, launcher, {}, train_args(dir, 4000))), env));
  }
  // The rendezvous hands out node ranks as hosts arrive: lose the one that
  // runs rank 0, once it has logged its first steps.
  int lost = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        for (int h = 0; h < 2; ++h) {
          if (nodes[h]->read_out().find("[rank 0] step ") != std::string::npos) lost = h;
        }
        return lost >= 0;
      },
      60s))
      << nodes[0]->read_out() << nodes[1]->read_out();
  hosts.kill_everything_on(lost);
  ASSERT_TRUE(nodes[lost]->wait(10s).exited);

  HealRun run{nodes[1 - lost]->wait(120s), dir};
  expect_healed(run, 2, 4000);
  EXPECT_TRUE(dropped(run.result.out, 0) && dropped(run.result.out, 1)) << run.result.out;
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  const ProcessResult served = server.wait(30s);
  EXPECT_TRUE(served.exited);
  EXPECT_EQ(served.code, 0) << served.out << served.err;
  EXPECT_NE(served.err.find("left out of round 1 (--on_failure=heal); 1 node(s) go on"),
            std::string::npos)
      << served.out << served.err;
}

// A host lost mid-run, and a spare machine started in its stead (as a
// scheduler replaces a dead node): the spare takes the lost node's place in
// the running round, its ranks are admitted by the survivors and heal from
// them, and both hosts finish the run together, with no restart. (The lost
// host itself started again takes its own place the same way.) The
// survivors step slowly while the group is short, so that the run is still
// going when the spare arrives.
TEST_F(HealMultiHost, ASpareHostTakesALostHostsPlaceInTheRunningRound) {
  NetnsHosts hosts(3);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "1:2", "heal-spare");
  std::map<std::string, std::string> env = kEnv;
  env["DDP_HEAL_WAIT_S"] = "2";
  const auto argv = [&](int h) {
    return hosts.on(h,
                    heal_argv(2, launcher, {"--slow_after_reform", "20"}, train_args(dir, 3000)));
  };
  auto node0 = std::make_unique<Subprocess>(argv(0), env);
  auto node1 = std::make_unique<Subprocess>(argv(1), env);
  ASSERT_TRUE(wait_until([&] { return node0->read_out().find("step ") != std::string::npos; }, 60s))
      << node0->read_out() << node0->read_err();
  hosts.kill_everything_on(1);
  ASSERT_TRUE(node1->wait(10s).exited);
  ASSERT_TRUE(wait_until(
      [&] { return node0->read_err().find("left out of round 1") != std::string::npos; }, 30s))
      << node0->read_err();

  Subprocess spare(argv(2), env);
  const ProcessResult joined = spare.wait(120s);
  HealRun run{node0->wait(120s), dir};
  ASSERT_TRUE(joined.exited) << joined.out << joined.err;
  EXPECT_EQ(joined.code, 0) << joined.out << joined.err;
  EXPECT_NE(joined.err.find("round 1: 2 node(s), world size 4; this node is node rank 1 with "
                            "ranks 2-3 (joined while it runs: the workers heal"),
            std::string::npos)
      << joined.err;
  EXPECT_NE(joined.out.find("[rank 2] heal: joined epoch"), std::string::npos) << joined.out;
  // The survivors admitted them (together, or one after the other); a small
  // state (under DDP_HEAL_STRIPE_MB's default) comes from one member.
  std::smatch admitted;
  EXPECT_TRUE(std::regex_search(
      run.result.out, admitted,
      std::regex(
          R"(arrived [23 ]+\| replaced none \| world [23] -> [34] \|[^\n]*MB from rank 0\n)")))
      << run.result.out;
  std::printf("spare admitted: %s", admitted.str().c_str());
  EXPECT_NE(run.result.err.find("takes the place of lost host"), std::string::npos)
      << run.result.err;
  run.result.out += joined.out;
  run.result.err += joined.err;
  expect_healed(run, 4, 3000);
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("joining the next round"), std::string::npos) << run.result.err;
}

// A third host arriving while an elastic job of two runs (--nnodes=2:3)
// joins the running round as node 2 with ranks 4-5: the live ranks admit
// its workers at a step boundary, they heal from them, and the run finishes
// on six ranks with no restart. The first ranks step slowly until then (a
// new node is let in only once the program has formed its first group).
TEST_F(HealMultiHost, AHostArrivingWhileTheRoundRunsJoinsItWithoutARestart) {
  NetnsHosts hosts(3);
  const std::string dir = make_temp_dir();
  const auto launcher = hosts_launcher(hosts, "2:3", "heal-grow", ",last_call_timeout=0");
  std::vector<std::string> train = train_args(dir, 2000);
  *(std::find(train.begin(), train.end(), "--log_every") + 1) = "50";  // the first line sooner
  const auto argv = [&](int h) {
    return hosts.on(h, heal_argv(2, launcher, {"--slow_before_reform", "20"}, train));
  };
  auto node0 = std::make_unique<Subprocess>(argv(0), kEnv);
  auto node1 = std::make_unique<Subprocess>(argv(1), kEnv);
  ASSERT_TRUE(wait_until([&] { return node0->read_out().find("step ") != std::string::npos; }, 60s))
      << node0->read_out() << node0->read_err();

  Subprocess arriving(argv(2), kEnv);
  const ProcessResult joined = arriving.wait(120s);
  HealRun run{node0->wait(120s), dir};
  const ProcessResult second = node1->wait(30s);
  ASSERT_TRUE(joined.exited) << joined.out << joined.err;
  EXPECT_EQ(joined.code, 0) << joined.out << joined.err;
  EXPECT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_NE(joined.err.find("round 1: 3 node(s), world size 6; this node is node rank 2 with "
                            "ranks 4-5 (joined while it runs: the workers heal"),
            std::string::npos)
      << joined.err;
  EXPECT_NE(run.result.err.find("joins running round 1 as node 2 (ranks 4-5; world 4 -> 6"),
            std::string::npos)
      << run.result.err;
  std::smatch admitted;
  EXPECT_TRUE(std::regex_search(
      run.result.out, admitted,
      std::regex(R"(arrived [45 ]+\| replaced none \| world [45] -> [56] \|[^\n]*\n)")))
      << run.result.out;
  std::printf("new host admitted: %s", admitted.str().c_str());
  run.result.out += second.out + joined.out;
  run.result.err += second.err + joined.err;
  expect_healed(run, 6, 2000);
  EXPECT_EQ(run.result.err.find("restarting the worker group"), std::string::npos)
      << run.result.err;
  EXPECT_EQ(run.result.err.find("scale-up"), std::string::npos) << run.result.err;
}

TEST(ElasticPlan, EveryEpochsSamplesAreInExactlyOneSliceWhateverTheWorldSize) {
  train::ElasticPlan plan(kDataset, 32, 2, 7);
  train::Position at;
  std::map<std::int64_t, std::multiset<std::int64_t>> seen;  // epoch -> dataset indices
  const int worlds[] = {4, 3, 1, 5, 2};
  for (int step = 0; at.epoch < 3; ++step) {
    const int world = worlds[step % 5];
    std::int64_t in_step = 0;
    for (int micro = 0; micro < 2; ++micro) {
      for (int rank = 0; rank < world; ++rank) {
        for (std::int64_t i : plan.slice(at, world, rank, micro)) {
          seen[at.epoch].insert(i);
          ++in_step;
        }
      }
    }
    EXPECT_EQ(in_step, plan.step_samples(at, world));
    at = plan.after(at, world);
  }
  for (const auto& [epoch, indices] : seen) {
    EXPECT_EQ(static_cast<std::int64_t>(indices.size()), kDataset) << "epoch " << epoch;
    EXPECT_EQ(
        static_cast<std::int64_t>(std::set<std::int64_t>(indices.begin(), indices.end()).size()),
        kDataset)
        << "epoch " << epoch << " repeats a sample";
  }
}

}  // namespace
}  // namespace ddp::testing
