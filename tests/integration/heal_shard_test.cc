// Live recovery with a sharded optimizer (--shard_optimizer) on one node:
// each rank also updates the optimizer shard of the rank half the world
// further on, so a dead rank's shard comes from that replica; an update of a
// step nobody finished is taken back; losing a shard and its replica
// restarts the group from the checkpoint.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "heal_run.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;

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

}  // namespace
}  // namespace ddp::testing
