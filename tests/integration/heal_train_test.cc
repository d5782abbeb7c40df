// Live recovery end to end on one node: ddprun --on_failure=heal running the
// reference trainer (heal_fault_worker), with ranks killed with SIGKILL
// mid-step, between steps, two at once and during a heal, and a rank hung
// with SIGSTOP; and the elastic plan that splits the rest of an epoch over
// a new world. Each run ends with the checks of heal_run.h.

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "elastic_plan.h"
#include "heal_run.h"
#include "shm_segments.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

// The ledger check itself: every process's lines must agree, but for the
// last line of a process that died before the end (a step its lost host
// finished on its own, which the survivors redid).
TEST(HealTrain, TheLedgerCheckAllowsOnlyADeadProcesssLastStepToDiffer) {
  const std::string full =
      "step 0 epoch 0 offset 0 count 128\nstep 1 epoch 0 offset 128 count 128\n"
      "step 2 epoch 0 offset 256 count 64\n";
  const std::string dir = make_temp_dir();
  write_file(dir + "/slog.0.100", full);
  write_file(dir + "/slog.1.101", full);
  EXPECT_EQ(ledger_problem(dir, 3), "");
  write_file(dir + "/slog.2.102",
             "step 0 epoch 0 offset 0 count 128\nstep 1 epoch 0 offset 128 count 256\n");
  EXPECT_EQ(ledger_problem(dir, 3), "") << "its last step, redone by the survivors";
  write_file(dir + "/slog.3.103",
             "step 0 epoch 0 offset 0 count 256\nstep 1 epoch 0 offset 256 count 256\n");
  EXPECT_EQ(ledger_problem(dir, 3), "step 0 was logged with two different sample ranges");
  std::filesystem::remove(dir + "/slog.3.103");
  write_file(dir + "/slog.1.101",
             "step 0 epoch 0 offset 0 count 128\nstep 1 epoch 0 offset 128 "
             "count 128\nstep 2 epoch 0 offset 256 count 32\n");
  EXPECT_EQ(ledger_problem(dir, 3), "step 2 was logged with two different sample ranges")
      << "two processes that finished disagree";
}

TEST(HealTrain, ARankKilledBetweenStepsIsReplacedAndTheRunLosesNothing) {
  const std::string run_id = "heal-train-" + std::to_string(::getpid());
  const auto run = run_heal(4, {"--kill", "3@150"}, 2500, {"--rdzv_id=" + run_id});
  expect_healed(run, 4, 2500);
  const std::string& out = run.result.out;
  // ddprun gave the dead rank's shm arena and state memory to its relaunch,
  // and nothing of the run is left in /dev/shm.
  EXPECT_NE(out.find("[rank 3] shm: took over the arena of the process this one replaces"),
            std::string::npos)
      << out;
  // And its state memory (weights and optimizer buffers: Healer::state_memory),
  // not zeroed (the state it receives overwrites it all), into which it
  // copied the state straight from the donor's.
  EXPECT_NE(out.find("[rank 3] heal: took over the state memory of the process this one replaces"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("of pages made, not zeroed)"), std::string::npos) << out;
  EXPECT_NE(out.find("read straight from rank 0's state memory"), std::string::npos) << out;
  EXPECT_EQ(shm_segments_of(run_id), std::vector<std::string>{});
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

// With steps of seconds (a large model), survivors that see a rank die hold
// the next epoch open for about a step for its relaunch: it is admitted in
// its predecessor's place in that one reform, instead of the survivors going
// on with three ranks and forming again at a later step boundary, where the
// relaunch would wait up to a step more. Here steps take 2 s and the
// relaunch starts 2.5 s after the kill, about 0.5 s after the survivors
// arrive at the next epoch.
TEST(HealTrain, WithLongStepsTheSurvivorsAdmitTheRelaunchInTheReformThatDropsItsPredecessor) {
  const auto run = run_heal(
      4, {"--kill", "1@3", "--slow_before_reform", "2000", "--relaunch_delay", "2500"}, 40);
  expect_healed(run, 4, 40);
  const std::string& out = run.result.out;
  EXPECT_NE(out.find("heal: epoch 1: left none | arrived none | replaced 1 | world 4 -> 4"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("heal: epoch 2:"), std::string::npos) << "one reform:\n" << out;
}

TEST(HealTrain, ADonorWhoseStateFileIsGoneHealsThroughTheGroup) {
  // Rank 3 dies after step 150; rank 0, the donor, removes its state
  // memory's file right after the reform. The relaunch cannot read the
  // state straight from it, so every member falls back to the transfer
  // through the group, and the run still ends with equal weights.
  const auto run = run_heal(4, {"--kill", "3@150", "--unlink_state_memory", "0"}, 600);
  expect_healed(run, 4, 600);
  const std::string& out = run.result.out;
  EXPECT_NE(run.result.err.find("--unlink_state_memory 0: removing /dev/shm/"), std::string::npos)
      << run.result.err;
  EXPECT_NE(out.find("[rank 3] heal: joined epoch"), std::string::npos) << out;
  EXPECT_EQ(out.find("read straight from"), std::string::npos) << out;
}

TEST(HealTrain, ARelaunchWaitingWhenTheSurvivorsShrankIsAdmittedBeforeTheyBuildAGradSync) {
  // Rank 3 dies after step 150; its relaunch starts 300 ms late, after the
  // survivors closed the epoch of three, and asks to be admitted while they
  // still linger after that reform. They admit it at once, in the same
  // heal (two reforms: epoch 2, one change): no GradSync is ever built over
  // the three of them (its construction logs "3 ranks").
  const auto run = run_heal(
      4, {"--kill", "3@150", "--relaunch_delay", "300", "--linger_after_reform", "2000"}, 600);
  expect_healed(run, 4, 600);
  const std::string& out = run.result.out;
  EXPECT_NE(out.find("heal: epoch 2: left none | arrived none | replaced 3 | world 4 -> 4"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(" 4 ranks, communication"), std::string::npos) << out;  // what is searched for
  EXPECT_EQ(out.find(" 3 ranks, communication"), std::string::npos) << out;
}

TEST(HealTrain, ARelaunchAskingWhileTheSurvivorsSettleIsAdmittedBeforeTheirNextStep) {
  // Rank 3 dies after step 150; its relaunch starts 300 ms late, after the
  // survivors closed the epoch of three and asked for arrivals once; they
  // then linger 3 s settled (GradSync built) before their first step. They
  // ask again before that step and admit the relaunch: the three of them
  // commit no step (asking right after a reform must not make them skip
  // the next boundary, which for a large model costs the relaunch a step).
  const auto run = run_heal(
      4, {"--kill", "3@150", "--relaunch_delay", "300", "--linger_after_settle", "3000"}, 600);
  expect_healed(run, 4, 600);
  const std::string& out = run.result.out;
  EXPECT_NE(out.find("left 3 | arrived none | replaced none | world 4 -> 3 | resumed at committed "
                     "step 150 |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("left none | arrived 3 | replaced none | world 3 -> 4 | resumed at "
                     "committed step 150 |"),
            std::string::npos)
      << out;
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

TEST(HealTrain, ARankKilledInTheForwardPassFailsTheStepBeforeTheBackwardPass) {
  // Rank 3 dies after the forward pass of the step that would commit 151;
  // the others look at their peers 1 s later, before their backward pass:
  // the step fails there, naming the dead rank, instead of at its first
  // all-reduce (a whole backward pass later on a large model).
  const auto run = run_heal(4, {"--kill_after_forward", "3@151"}, 600);
  expect_healed(run, 4, 600);
  const std::string all = run.result.out + run.result.err;
  EXPECT_EQ(count_of(all, "did not commit"), 3u) << all;
  for (int r : {0, 1, 2}) {
    EXPECT_NE(all.find("heal: step 150 did not commit: rank " + std::to_string(r) +
                       " (epoch 0): a peer is gone: rank 3 (pid "),
              std::string::npos)
        << all;
  }
  EXPECT_TRUE(dropped(run.result.out, 3)) << run.result.out;
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

// A /dev/shm too small for the ranks' state memory (a container's, say):
// each rank says so once and keeps its weights and momentum in private
// memory instead of failing with SIGBUS at first touch, and a killed rank
// is still replaced (it receives the state; there is nothing to inherit).
TEST(HealTrain, ADevShmWithoutRoomForTheStateKeepsItPrivateAndTheRunStillHeals) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a mount namespace with a 16 MiB /dev/shm";
  const std::string dir = make_temp_dir();
  std::vector<std::string> train = train_args(dir, 120);
  // 32-1024-1024-1024-10 with SGD momentum: 16.4 MiB of state per rank.
  const auto hidden = std::find(train.begin(), train.end(), "--hidden");
  ASSERT_NE(hidden, train.end());
  *(hidden + 1) = "1024";
  std::vector<std::string> argv = {
      "unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=16m tmpfs /dev/shm && exec \"$@\"",
      "sh"};
  for (const std::string& a : heal_argv(2, {}, {"--kill", "1@40"}, train)) argv.push_back(a);
  Subprocess p(argv, kEnv);
  HealRun run{p.wait(120s), dir};
  expect_healed(run, 2, 120);
  const std::string all = run.result.out + run.result.err;
  for (const char* rank : {"[rank 0]", "[rank 1]"}) {
    EXPECT_NE(all.find(std::string(rank) +
                       " WARNING: heal: /dev/shm has no room for 16.4 MiB of state memory"),
              std::string::npos)
        << all;
  }
  EXPECT_EQ(all.find("took over the state memory"), std::string::npos) << all;
  EXPECT_NE(
      run.result.err.find("rank 1 (local rank 1) exited with signal 9 (SIGKILL): relaunching"),
      std::string::npos)
      << run.result.err;
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
