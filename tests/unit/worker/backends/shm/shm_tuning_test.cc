// How the shm backend picks a collective's algorithm variant, with every rank
// a thread of this process (each maps the node's segment itself): timed by
// the ranks together and identical on every rank, forced by DDP_SHM_ALGO (the
// group's shm_algorithm), kept in a tune file (DDP_SHM_TUNE_FILE) that the
// next group reads, and every bad setting an error naming it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/process_group.h"
#include "ddp/store.h"
#include "error_of.h"
#include "scoped_env.h"
#include "shm_segments.h"
#include "thread_ranks.h"
#include "unique_run_id.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using ::ddp::testing::error_of;
using ::ddp::testing::on_ranks;
using ::ddp::testing::ScopedEnv;
using ::ddp::testing::shm_segments_of;
using ::ddp::testing::unique_run_id;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class ShmTuning : public ::testing::Test {
 protected:
  ProcessGroupOptions options(const std::string& algorithm = "") const {
    ProcessGroupOptions o;
    o.backend = "shm";
    o.timeout = 30s;
    o.run_id = run_id_;
    o.shm_algorithm = algorithm;
    return o;
  }
  // What a group of two ranks times for 1 MiB all_reduces ("" after a
  // failure, which it reports), at its first such call.
  std::string time_a_1_mib_all_reduce_on_two_ranks() const {
    std::string timed;
    on_ranks(
        2,
        [&](ProcessGroup& pg) {
          auto block = pg.allocate(1 << 20);
          pg.all_reduce(block.get(), (1 << 20) / 4, DType::kFloat32);
          if (pg.rank() == 0) timed = pg.algorithm_for("all_reduce", 1 << 20);
        },
        options());
    EXPECT_TRUE(contains(timed, "(timed)")) << timed;
    if (!contains(timed, "(timed)")) return "";
    return timed.substr(0, timed.find(' '));
  }
  // Creates a group on each of `world` threads with options_of(rank) and runs
  // `body`; returns what each rank threw ("" for none), creation included.
  std::vector<std::string> errors_on_ranks(
      int world, const std::function<ProcessGroupOptions(int)>& options_of,
      const std::function<void(ProcessGroup&)>& body) {
    auto store = make_prefix_store(make_memory_store(), "tuning");
    std::vector<std::string> errors(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        errors[r] = error_of([&] {
          auto group = ProcessGroup::create(r, world, store, options_of(r));
          body(*group);
        });
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  }
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    EXPECT_EQ(shm_segments_of(run_id_), std::vector<std::string>{})
        << "segments of run " << run_id_ << " left";
  }
  const std::string run_id_ = unique_run_id("tune");
  const std::string dir_ = std::filesystem::temp_directory_path() / ("ddp-" + run_id_);
};

// Four ranks on this machine's cores time each variant with their own clocks
// (their times differ), yet every rank reports the same choice for every
// collective and size class, and each call's result is right.
TEST_F(ShmTuning, EveryRankAgreesOnEveryChoiceItTimed) {
  ScopedEnv budget("DDP_SHM_TUNE_BUDGET_MS",
                   "1000000");  // time every class, however slow this machine is
  const int n = 4;
  std::mutex mu;
  std::vector<std::vector<std::string>> reports(n);
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        const int me = pg.rank();
        std::vector<std::string> mine;
        for (std::size_t bytes = 512; bytes <= (std::size_t{4} << 20); bytes *= 4) {
          const std::size_t count = bytes / sizeof(float);
          auto block = pg.allocate(bytes * n * 2);
          auto* f = static_cast<float*>(block.get());
          for (std::size_t i = 0; i < count; ++i) f[i] = static_cast<float>(me + 1);
          pg.all_reduce(f, count, DType::kFloat32);
          ASSERT_EQ(f[count - 1], 10.0f) << bytes;
          for (std::size_t i = 0; i < count * n; ++i) f[i] = 1.0f;
          pg.reduce_scatter(f, f + count * n, count, DType::kFloat32, ReduceOp::kSum);
          ASSERT_EQ(f[count * n + count - 1], 4.0f) << bytes;
          for (std::size_t i = 0; i < count; ++i) f[me * count + i] = static_cast<float>(me);
          pg.all_gather(f + me * count, f, count, DType::kFloat32);
          ASSERT_EQ(f[3 * count], 3.0f) << bytes;
          for (std::size_t i = 0; i < count; ++i) f[i] = me == 2 ? 7.0f : 0.0f;
          pg.broadcast(f, count, DType::kFloat32, 2);
          ASSERT_EQ(f[count - 1], 7.0f) << bytes;
          for (const std::string c : {"all_reduce", "reduce_scatter", "all_gather", "broadcast"}) {
            const std::string choice = pg.algorithm_for(c, bytes);
            EXPECT_TRUE(contains(choice, "(timed)")) << c << " " << bytes << ": '" << choice << "'";
            mine.push_back(c + " " + std::to_string(bytes) + ": " + choice);
          }
        }
        EXPECT_EQ(pg.algorithm_for("all_reduce", std::size_t{64} << 20), "")
            << "a class no call used";
        EXPECT_EQ(pg.algorithm_for("gather", 512), "") << "not a collective with variants";
        std::lock_guard<std::mutex> lock(mu);
        reports[me] = std::move(mine);
      },
      options());
  ASSERT_FALSE(reports[0].empty());
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(reports[r], reports[0]) << "rank " << r << " chose differently from rank 0";
}

TEST_F(ShmTuning, AForcedVariantIsReportedAsForcedAndTheOthersAreStillTimed) {
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.algorithm_for("all_reduce", 1 << 20), "pull (forced)");
        EXPECT_EQ(pg.algorithm_for("broadcast", 1 << 20), "") << "nothing timed yet";
        auto block = pg.allocate(1 << 20);
        pg.broadcast(block.get(), (1 << 20) / 4, DType::kFloat32, 0);
        EXPECT_TRUE(contains(pg.algorithm_for("broadcast", 1 << 20), "(timed)"))
            << pg.algorithm_for("broadcast", 1 << 20);
        EXPECT_EQ(pg.algorithm_for("broadcast", 1 << 10), "") << "another size class";
      },
      options("all_reduce=pull"));
  on_ranks(
      2, [&](ProcessGroup& pg) { EXPECT_EQ(pg.algorithm_for("all_gather", 8), "push (forced)"); },
      options("push"));
  // Not shm: nothing to choose.
  on_ranks(2, [&](ProcessGroup& pg) { EXPECT_EQ(pg.algorithm_for("all_reduce", 8), ""); });
}

TEST_F(ShmTuning, RanksThatForceDifferentVariantsFailNamingTheSettingOfEach) {
  const auto errors = errors_on_ranks(
      2, [&](int rank) { return options(rank == 0 ? "all_reduce=push" : ""); },
      [](ProcessGroup& pg) {
        std::vector<float> data(4096, 1.0f);
        pg.all_reduce(data.data(), data.size(), DType::kFloat32);
      });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
    EXPECT_TRUE(contains(errors[r], "force different algorithms (DDP_SHM_ALGO)"));
    EXPECT_TRUE(contains(errors[r], r == 0 ? "rank 0 all_reduce=push, rank 1 auto"
                                           : "rank 1 auto, rank 0 all_reduce=push"));
  }
  const auto bad = errors_on_ranks(
      2, [&](int) { return options("all_gather=small"); }, [](ProcessGroup&) {});
  for (const std::string& e : bad) {
    EXPECT_TRUE(contains(
        e,
        "process group option shm_algorithm='all_gather=small': all_gather has no variant 'small'"))
        << e;
  }
}

// Once the ranks have spent the timing budget, a class not timed yet takes
// the choice of the nearest timed class of its collective (chunked when there
// is none), the same on every rank; a budget of 0 times nothing.
TEST_F(ShmTuning, OnceTheTimingBudgetIsSpentLaterClassesTakeTheNearestChoice) {
  {
    ScopedEnv budget("DDP_SHM_TUNE_BUDGET_MS", "0.001");
    std::mutex mu;
    std::vector<std::string> reports(3);
    on_ranks(
        3,
        [&](ProcessGroup& pg) {
          auto block = pg.allocate(std::size_t{4} << 20);
          auto* f = static_cast<float*>(block.get());
          for (std::size_t count :
               {std::size_t{16} << 10, std::size_t{1} << 20}) {  // 64 KiB, then 4 MiB
            std::fill(f, f + count, 2.0f);
            pg.all_reduce(f, count, DType::kFloat32);
            ASSERT_EQ(f[count - 1], 6.0f);
          }
          const std::string first = pg.algorithm_for("all_reduce", 64 << 10);
          ASSERT_TRUE(contains(first, "(timed)")) << first;
          EXPECT_EQ(pg.algorithm_for("all_reduce", 4 << 20),
                    first.substr(0, first.find(' ')) +
                        " (as the nearest timed class: timing budget spent)");
          pg.broadcast(f, 100, DType::kFloat32, 1);
          EXPECT_EQ(pg.algorithm_for("broadcast", 400),
                    "chunked (as the nearest timed class: timing budget spent)");
          std::lock_guard<std::mutex> lock(mu);
          reports[pg.rank()] = first + " / " + pg.algorithm_for("all_reduce", 4 << 20);
        },
        options());
    EXPECT_EQ(reports[1], reports[0]);
    EXPECT_EQ(reports[2], reports[0]);
  }
  ScopedEnv none("DDP_SHM_TUNE_BUDGET_MS", "0");
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        auto block = pg.allocate(4096);
        pg.all_reduce(block.get(), 1024, DType::kFloat32);
        EXPECT_EQ(pg.algorithm_for("all_reduce", 4096),
                  "chunked (as the nearest timed class: timing budget spent)");
      },
      options());
  ScopedEnv bad("DDP_SHM_TUNE_BUDGET_MS", "soon");
  for (const std::string& e : errors_on_ranks(
           2, [&](int) { return options(); }, [](ProcessGroup&) {})) {
    EXPECT_TRUE(contains(e, "DDP_SHM_TUNE_BUDGET_MS='soon' is not a number of milliseconds")) << e;
  }
}

// The choices timed by one group are saved (by local rank 0) and read by the
// next group on the machine, which then times nothing it finds there; lines
// for other numbers of ranks stay in the file.
TEST_F(ShmTuning, TheTuneFileKeepsTheChoicesForTheNextGroup) {
  const std::string path = dir_ + "/tune";
  write_text(path, "# mine\nall_reduce 7 1024 small\n");
  ScopedEnv env("DDP_SHM_TUNE_FILE", path);
  const std::string chosen = time_a_1_mib_all_reduce_on_two_ranks();
  ASSERT_FALSE(chosen.empty());
  std::string text = read_text(path);
  EXPECT_TRUE(contains(text, "all_reduce 2 1048576 " + chosen + "\n")) << text;
  EXPECT_TRUE(contains(text, "all_reduce 7 1024 small\n")) << text;
  EXPECT_TRUE(contains(text, "# libddp shm algorithm choices")) << text;

  // The next group takes what the file says, even a variant timing did not pick.
  const std::string other = chosen == "chunked" ? "pull" : "chunked";
  write_text(path, "all_reduce 2 1048576 " + other + "\nbroadcast 2 1024 push\n");
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.algorithm_for("all_reduce", 1 << 20), other + " (DDP_SHM_TUNE_FILE)");
        EXPECT_EQ(pg.algorithm_for("broadcast", 100), "push (DDP_SHM_TUNE_FILE)");
        auto block = pg.allocate(1 << 20);
        auto* f = static_cast<float*>(block.get());
        for (std::size_t i = 0; i < (1 << 18); ++i) f[i] = 1.5f;
        pg.all_reduce(f, 1 << 18, DType::kFloat32);
        EXPECT_EQ(f[(1 << 18) - 1], 3.0f);
        EXPECT_EQ(pg.algorithm_for("all_reduce", 1 << 20), other + " (DDP_SHM_TUNE_FILE)");
      },
      options());
  text = read_text(path);
  EXPECT_TRUE(contains(text, "all_reduce 2 1048576 " + other + "\n"))
      << "nothing new was timed: " << text;
}

// A rebuilt group (live recovery makes one per epoch) starts from what the
// run's earlier groups of its shape timed, rather than timing again in its
// first step; another shape or another run times for itself.
TEST_F(ShmTuning, AGroupStartsFromTheChoicesTheRunsEarlierGroupsOfItsShapeTimed) {
  const std::string chosen = time_a_1_mib_all_reduce_on_two_ranks();
  ASSERT_FALSE(chosen.empty());
  on_ranks(
      2,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.algorithm_for("all_reduce", 1 << 20),
                  chosen + " (timed by an earlier group of this run)");
        EXPECT_EQ(pg.algorithm_for("broadcast", 1 << 20), "") << "never timed";
        auto block = pg.allocate(1 << 20);
        auto* f = static_cast<float*>(block.get());
        for (std::size_t i = 0; i < (1 << 18); ++i) f[i] = 1.5f;
        pg.all_reduce(f, 1 << 18, DType::kFloat32);
        EXPECT_EQ(f[(1 << 18) - 1], 3.0f);
      },
      options());
  on_ranks(
      3, [&](ProcessGroup& pg) { EXPECT_EQ(pg.algorithm_for("all_reduce", 1 << 20), ""); },
      options());
  ProcessGroupOptions other_run = options();
  other_run.run_id = run_id_ + "b";
  on_ranks(
      2, [&](ProcessGroup& pg) { EXPECT_EQ(pg.algorithm_for("all_reduce", 1 << 20), ""); },
      other_run);
}

TEST_F(ShmTuning, AMalformedTuneFileFailsEveryRankNamingTheFileAndLine) {
  const std::string path = dir_ + "/bad";
  write_text(path, "all_reduce 2 1048576 pull\nall_reduce 2 1000 pull\n");
  ScopedEnv env("DDP_SHM_TUNE_FILE", path);
  const auto errors = errors_on_ranks(
      3, [&](int) { return options(); }, [](ProcessGroup&) {});
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
    EXPECT_TRUE(contains(errors[r], "shm tune file " + path + " line 2"));
    EXPECT_TRUE(contains(errors[r], "MAX_BYTES '1000' is not a power of two"));
  }
  // A folder where the file should be: the file cannot be read.
  std::filesystem::remove(path);
  std::filesystem::create_directories(path);
  const auto folder = errors_on_ranks(
      2, [&](int) { return options(); }, [](ProcessGroup&) {});
  for (const std::string& e : folder) EXPECT_TRUE(contains(e, "shm tune file " + path)) << e;
}

}  // namespace
}  // namespace ddp
