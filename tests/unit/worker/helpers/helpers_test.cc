// libddp's helpers (log, metrics, params): the pure rules directly, the
// collective helpers on groups whose ranks are threads of this process (Gloo
// over loopback, an in-memory store), and the logging policy in a child
// process with a faked environment contract.

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include "base/log_rules.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/log.h"
#include "ddp/metrics.h"
#include "ddp/params.h"
#include "error_of.h"
#include "subprocess.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using log::Level;
using log::Policy;

// ------------------------------------------------------------------ harness

// Runs body(group) on `n` ranks, each a thread with its own Gloo group over a
// shared in-memory store. Returns each rank's error message ("" if none).
std::vector<std::string> on_ranks(int n, const std::function<void(ProcessGroup&)>& body) {
  static std::atomic<int> next_job{0};
  auto store = make_prefix_store(make_memory_store(), "job" + std::to_string(next_job++));
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions options;
        options.backend = "gloo";
        options.timeout = 20s;
        auto group = ProcessGroup::create(r, n, store, options);
        body(*group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

bool world_of_one() { return !is_distributed() && !is_initialized(); }

// ------------------------------------------------------------------ logging

TEST(LogRules, InfoPrintsOnlyOnRankZeroByDefault) {
  EXPECT_TRUE(log::should_print(Level::kInfo, false, Level::kInfo, Policy::kRank0, 0, 0));
  EXPECT_FALSE(log::should_print(Level::kInfo, false, Level::kInfo, Policy::kRank0, 1, 1));
  // Rank 4 is local rank 0 of the second node: still silent under kRank0.
  EXPECT_FALSE(log::should_print(Level::kInfo, false, Level::kInfo, Policy::kRank0, 4, 0));
}

TEST(LogRules, LocalRankZeroPolicyPrintsOnEveryNodesFirstRank) {
  EXPECT_TRUE(log::should_print(Level::kInfo, false, Level::kInfo, Policy::kLocalRank0, 4, 0));
  EXPECT_TRUE(log::should_print(Level::kDebug, false, Level::kDebug, Policy::kLocalRank0, 4, 0));
  EXPECT_FALSE(log::should_print(Level::kInfo, false, Level::kInfo, Policy::kLocalRank0, 5, 1));
}

TEST(LogRules, AllAndWarningsAndErrorsPrintOnEveryRank) {
  EXPECT_TRUE(log::should_print(Level::kInfo, true, Level::kInfo, Policy::kRank0, 3, 3));
  EXPECT_TRUE(log::should_print(Level::kWarn, false, Level::kInfo, Policy::kRank0, 3, 3));
  EXPECT_TRUE(log::should_print(Level::kError, false, Level::kInfo, Policy::kRank0, 3, 3));
}

TEST(LogRules, LevelThresholdDropsLowerLevels) {
  EXPECT_FALSE(log::should_print(Level::kDebug, false, Level::kInfo, Policy::kRank0, 0, 0));
  EXPECT_FALSE(log::should_print(Level::kDebug, true, Level::kInfo, Policy::kRank0, 0, 0));
  EXPECT_FALSE(log::should_print(Level::kWarn, true, Level::kError, Policy::kRank0, 0, 0));
  EXPECT_TRUE(log::should_print(Level::kError, true, Level::kError, Policy::kRank0, 2, 2));
  EXPECT_FALSE(log::should_print(Level::kError, true, Level::kOff, Policy::kRank0, 0, 0));
}

TEST(LogRules, DecorateAddsTheRankPrefixToAllLinesAndWarnings) {
  EXPECT_EQ(log::decorate(Level::kInfo, false, 0, 4, "epoch 1"), "epoch 1");
  EXPECT_EQ(log::decorate(Level::kInfo, true, 2, 4, "shard 2"), "[rank 2] shard 2");
  EXPECT_EQ(log::decorate(Level::kWarn, true, 3, 4, "slow"), "[rank 3] WARNING: slow");
  EXPECT_EQ(log::decorate(Level::kError, false, 1, 4, "bad"), "[rank 1] ERROR: bad");
  EXPECT_EQ(log::decorate(Level::kDebug, true, 1, 4, "x"), "[rank 1] DEBUG: x");
  // Under ddprun's own "[rank N] " prefix the library does not repeat it.
  EXPECT_EQ(log::decorate(Level::kWarn, true, 3, 4, "slow", true), "WARNING: slow");
  EXPECT_EQ(log::decorate(Level::kInfo, true, 2, 4, "shard 2", true), "shard 2");
  EXPECT_EQ(log::decorate(Level::kError, false, 1, 4, "a\nb", true), "ERROR: a\nERROR: b");
}

TEST(LogRules, DecorateHasNoRankPrefixInAWorldOfOne) {
  EXPECT_EQ(log::decorate(Level::kInfo, true, 0, 1, "hello"), "hello");
  EXPECT_EQ(log::decorate(Level::kWarn, true, 0, 1, "careful"), "WARNING: careful");
}

TEST(LogRules, DecoratePrefixesEveryLineOfAMessage) {
  EXPECT_EQ(log::decorate(Level::kWarn, true, 1, 2, "a\nb"),
            "[rank 1] WARNING: a\n[rank 1] WARNING: b");
  EXPECT_EQ(log::decorate(Level::kInfo, false, 0, 2, "a\nb"), "a\nb");
}

TEST(LogRules, ParseLevelAcceptsTheUsualNames) {
  Level level = Level::kInfo;
  EXPECT_TRUE(log::parse_level("DEBUG", &level));
  EXPECT_EQ(level, Level::kDebug);
  EXPECT_TRUE(log::parse_level("warning", &level));
  EXPECT_EQ(level, Level::kWarn);
  EXPECT_TRUE(log::parse_level("off", &level));
  EXPECT_EQ(level, Level::kOff);
  EXPECT_FALSE(log::parse_level("loud", &level));
  EXPECT_EQ(level, Level::kOff);
}

class LogSinks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (is_distributed()) GTEST_SKIP() << "needs a world of one (run outside ddprun)";
    log::set_sinks([this](std::string_view line) { out_ << line; },
                   [this](std::string_view line) { err_ << line; });
  }
  void TearDown() override {
    log::reset_sinks();
    log::set_level(Level::kInfo);
    log::set_policy(Policy::kRank0);
  }
  std::ostringstream out_, err_;
};

TEST_F(LogSinks, InfoGoesToOutAndWarningsAndErrorsToErr) {
  log::info("loss {:.2f}", 0.125);
  log::info_all("everyone {}", 1);
  log::warn("careful {}", "now");
  log::error("broken");
  EXPECT_EQ(out_.str(), "loss 0.12\neveryone 1\n");
  EXPECT_EQ(err_.str(), "WARNING: careful now\nERROR: broken\n");
}

TEST_F(LogSinks, LevelAndDebugFollowTheThreshold) {
  log::debug("hidden");
  log::set_level(Level::kDebug);
  log::debug("shown {}", 2);
  log::set_level(Level::kError);
  log::warn("dropped");
  log::error("kept");
  EXPECT_EQ(out_.str(), "DEBUG: shown 2\n");
  EXPECT_EQ(err_.str(), "ERROR: kept\n");
  EXPECT_FALSE(log::enabled(Level::kWarn, true));
}

TEST_F(LogSinks, RankZeroOfAWorldOfOneIsTheLoggingRank) {
  EXPECT_TRUE(log::is_logging_rank());
  log::set_policy(Policy::kLocalRank0);
  EXPECT_EQ(log::policy(), Policy::kLocalRank0);
  EXPECT_TRUE(log::is_logging_rank());
}

// The real library in a process that believes it is rank 1 of 2, local rank 0
// of the second node.
testing::ProcessResult run_log_worker(const std::string& policy) {
  return testing::run_process({HELPERS_WORKER_PATH, "log", policy},
                              {{"RANK", "1"},
                               {"WORLD_SIZE", "2"},
                               {"LOCAL_RANK", "0"},
                               {"LOCAL_WORLD_SIZE", "1"},
                               {"GROUP_RANK", "1"},
                               {"GROUP_WORLD_SIZE", "2"},
                               {"DDP_LOG_LEVEL", "\x01"}},
                              30s);
}

TEST(LogPolicy, RankOneShowsOnlyItsAllLinesAndWarningsUnderRankZeroPolicy) {
  auto r = run_log_worker("rank0");
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 1] INFO-ALL from 1\n");
  EXPECT_EQ(r.err, "[rank 1] WARNING: WARN from 1\n[rank 1] ERROR: ERR from 1\n");
}

TEST(LogPolicy, LocalRankZeroPolicyLetsEveryNodesFirstRankSpeak) {
  auto r = run_log_worker("local0");
  ASSERT_TRUE(r.exited);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "INFO-ONE from 1\n[rank 1] INFO-ALL from 1\nDEBUG: DEBUG-SHOWN from 1\n");
  EXPECT_EQ(r.err, "[rank 1] WARNING: WARN from 1\n[rank 1] ERROR: ERR from 1\n");
}

// ------------------------------------------------------------------ metrics

static_assert(dtype_of<float>() == DType::kFloat32);
static_assert(dtype_of<double>() == DType::kFloat64);
static_assert(dtype_of<int>() == DType::kInt32);
static_assert(dtype_of<long long>() == DType::kInt64);
static_assert(dtype_of<std::uint8_t>() == DType::kUInt8);
static_assert(!HasDType<unsigned>);
static_assert(!HasDType<bool>);

TEST(MetricsHelpers, HelpersAreTheIdentityInAWorldOfOneWithoutInit) {
  if (!world_of_one()) GTEST_SKIP() << "needs a world of one";
  EXPECT_EQ(reduce_sum(7), 7);
  EXPECT_EQ(reduce_mean(2.5), 2.5);
  std::vector<float> v = {1, 2};
  reduce_mean(std::span<float>(v));
  EXPECT_EQ(v, (std::vector<float>{1, 2}));
  Metrics m = {{"loss", 0.5}, {"acc", 0.75}};
  EXPECT_EQ(average_metrics(m, 32), m);
}

TEST(MetricsHelpers, AverageMetricsWithAWorldOfOneGroupReturnsTheMetrics) {
  ProcessGroupOptions options;
  options.backend = "local";
  auto group = ProcessGroup::create(0, 1, nullptr, options);
  Metrics m = {{"loss", 0.5}};
  EXPECT_EQ(average_metrics(m, 10, *group), m);
  EXPECT_EQ(reduce_sum(3.0, *group), 3.0);
  EXPECT_EQ(reduce_mean(3.0, *group), 3.0);
}

TEST(MetricsHelpers, AverageMetricsWeightsEachRankByItsCount) {
  std::vector<Metrics> results(3);
  expect_no_errors(on_ranks(3, [&](ProcessGroup& g) {
    int r = g.rank();
    // Counts 1, 2, 3; losses 3, 6, 9: (3 + 12 + 27) / 6 = 7.
    results[r] =
        average_metrics({{"loss", 3.0 * (r + 1)}, {"acc", r == 0 ? 1.0 : 0.0}}, r + 1.0, g);
  }));
  for (int r = 0; r < 3; ++r) {
    EXPECT_DOUBLE_EQ(results[r]["loss"], 7.0) << "rank " << r;
    EXPECT_DOUBLE_EQ(results[r]["acc"], 1.0 / 6) << "rank " << r;
  }
}

TEST(MetricsHelpers, AverageMetricsNamesTheRankWhoseKeysDiffer) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    Metrics m = {{"loss", 1.0}, {"acc", 1.0}};
    if (g.rank() == 2) m = {{"loss", 1.0}, {"top5", 1.0}};
    average_metrics(m, 1.0, g);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("rank 2 has ['loss', 'top5'], rank 0 has ['acc', 'loss']"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("rank 2 lacks ['acc']; rank 2 has extra ['top5']"), std::string::npos)
        << errors[r];
  }
}

TEST(MetricsHelpers, AverageMetricsNamesALoneRankZero) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    Metrics m = {{"loss", 1.0}};
    if (g.rank() == 0) m["extra"] = 2.0;
    average_metrics(m, 1.0, g);
  });
  for (const auto& e : errors) {
    EXPECT_EQ(
        e,
        "average_metrics: metric keys differ across ranks: rank 0 has ['extra', 'loss'], rank 1 "
        "has ['loss'] (rank 0 has extra ['extra'])");
  }
}

TEST(MetricsHelpers, AverageMetricsRejectsCountsThatSumToZero) {
  auto errors = on_ranks(2, [](ProcessGroup& g) { average_metrics({{"x", 1.0}}, 0.0, g); });
  for (const auto& e : errors) EXPECT_NE(e.find("counts sum to 0"), std::string::npos) << e;
}

TEST(MetricsHelpers, ReduceSumAndMeanOverThreads) {
  expect_no_errors(on_ranks(4, [](ProcessGroup& g) {
    int r = g.rank();
    if (reduce_sum(std::int64_t{r}, g) != 6) throw Error("reduce_sum");
    if (reduce_mean(r, g) != 1.5) throw Error("reduce_mean");
    std::vector<double> v = {double(r), 1.0};
    reduce_mean(std::span<double>(v), g);
    if (v[0] != 1.5 || v[1] != 1.0) throw Error("reduce_mean buffer");
  }));
}

// ------------------------------------------------------------------- memory

TEST(MemoryUsage, ParseSmapsSumsThePrivateLines) {
  const char* text =
      "55d0c0a00000-7ffd1c5f2000 ---p 00000000 00:00 0                          [rollup]\n"
      "Rss:               12345 kB\n"
      "Shared_Clean:       1000 kB\n"
      "Private_Clean:       300 kB\n"
      "Private_Dirty:       700 kB\n"
      "Private_Hugetlb:       9 kB\n"
      "Private_Dirty:        24 kB\n";
  EXPECT_EQ(parse_smaps_uss(text), (300u + 700u + 24u) * 1024u);
  EXPECT_EQ(parse_smaps_uss(""), 0u);
}

TEST(MemoryUsage, UssIsPositiveAndGrowsWhenABigAllocationIsTouched) {
  std::uint64_t before = memory_usage();
  EXPECT_GT(before, 0u);
  constexpr std::size_t kBig = 64u << 20;
  std::vector<char> big(kBig, 1);  // every page written: private and dirty
  std::uint64_t after = memory_usage();
  EXPECT_EQ(big[kBig - 1], 1);
  EXPECT_GE(after, before + kBig * 3 / 4) << "before " << before << " after " << after;
  MemoryStats stats = memory_stats();
  EXPECT_GT(stats.uss, 0u);
  EXPECT_GE(stats.rss, kBig);
  EXPECT_GE(stats.peak_rss, stats.rss);
}

// ------------------------------------------------------------------- params

std::vector<ParamInfo> model() {
  return {{"fc1.weight", {20, 10}, DType::kFloat32},
          {"fc1.bias", {20}, DType::kFloat32},
          {"fc2.weight", {10, 21}, DType::kFloat32},
          {"fc2.bias", {10}, DType::kFloat32}};
}

TEST(ParamDifference, SameParamsHaveNoDifference) {
  EXPECT_EQ(describe_param_difference(model(), 0, model(), 1), "");
}

TEST(ParamDifference, NamesTheShapeTheRankAndTheParameter) {
  auto other = model();
  other[2].shape = {10, 20};
  EXPECT_EQ(describe_param_difference(model(), 0, other, 1),
            "parameter 2 'fc2.weight': rank 1 has shape [10, 20], rank 0 has [10, 21]");
}

TEST(ParamDifference, NamesDifferentNamesAndDtypes) {
  auto other = model();
  other[1].name = "fc1.b";
  EXPECT_EQ(describe_param_difference(model(), 0, other, 3),
            "parameter 1: rank 3 has name 'fc1.b', rank 0 has 'fc1.bias'");
  other = model();
  other[3].dtype = DType::kBFloat16;
  EXPECT_EQ(describe_param_difference(model(), 0, other, 2),
            "parameter 3 'fc2.bias': rank 2 has dtype bfloat16, rank 0 has float32");
}

TEST(ParamDifference, ReportsDifferentCountsWithTheFirstExtraOrDifference) {
  auto longer = model();
  longer.push_back({"fc3.weight", {5}, DType::kFloat16});
  EXPECT_EQ(
      describe_param_difference(model(), 0, longer, 1),
      "rank 1 has 5 parameters, rank 0 has 4; first extra: parameter 4 'fc3.weight' on rank 1");
  auto shorter = model();
  shorter.erase(shorter.begin());
  EXPECT_EQ(describe_param_difference(model(), 0, shorter, 2),
            "rank 2 has 3 parameters, rank 0 has 4; first difference: parameter 0: rank 2 has name "
            "'fc1.bias', "
            "rank 0 has 'fc1.weight'");
  EXPECT_EQ(
      describe_param_difference({}, 0, std::vector<ParamInfo>{{"w", {1}, DType::kFloat32}}, 1),
      "rank 1 has 1 parameter, rank 0 has 0; first extra: parameter 0 'w' on rank 1");
}

TEST(CheckSameParams, EveryRankNamesTheRankAndParameterThatDiffer) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    check_same_params(model(), g);  // agree: no error
    auto params = model();
    if (g.rank() == 1) params[2].shape = {10, 20};
    check_same_params(params, g);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r],
              "check_same_params: parameter 2 'fc2.weight': rank 1 has shape [10, 20], rank 0 has "
              "[10, 21]")
        << "rank " << r;
  }
}

TEST(CheckSameParams, ListsEveryRankThatDiffers) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    auto params = model();
    if (g.rank() == 1) params.pop_back();
    if (g.rank() == 2) params[0].dtype = DType::kFloat16;
    check_same_params(params, g);
  });
  for (const auto& e : errors) {
    EXPECT_EQ(e,
              "check_same_params: rank 1 has 3 parameters, rank 0 has 4; first extra: parameter 3 "
              "'fc2.bias' on rank 0; ranks differing from rank 0: 1, 2");
  }
}

TEST(CheckSameParams, ALoneRankZeroIsTheOneNamed) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    auto params = model();
    if (g.rank() == 0) params[1].shape = {21};
    check_same_params(params, g);
  });
  for (const auto& e : errors) {
    EXPECT_EQ(e,
              "check_same_params: parameter 1 'fc1.bias': rank 0 has shape [21], rank 1 has [20]");
  }
}

// Buffers of several dtypes whose values tell ranks apart.
struct Buffers {
  std::vector<float> a;
  std::vector<std::int32_t> b;
  std::vector<double> c;
  std::vector<std::uint16_t> d;  // bfloat16
  explicit Buffers(int rank) : a(100), b(3), c(300), d(9) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(rank * 1000 + i);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = rank * 7 + static_cast<int>(i);
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = rank + 0.25 * i;
    for (std::size_t i = 0; i < d.size(); ++i)
      d[i] = float_to_bfloat16(static_cast<float>(rank * 2 + i));
  }
  std::vector<ParamBuffer> views() {
    return {{a.data(), a.size(), DType::kFloat32},
            {b.data(), b.size(), DType::kInt32},
            {c.data(), c.size(), DType::kFloat64},
            {d.data(), d.size(), DType::kBFloat16}};
  }
  bool operator==(const Buffers&) const = default;
};

class ChunkSizes : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ChunkSizes, BroadcastParamsGivesEveryRankTheRootsValues) {
  const std::size_t chunk = GetParam();
  std::vector<char> same(3);
  expect_no_errors(on_ranks(3, [&](ProcessGroup& g) {
    Buffers mine(g.rank());
    SyncOptions options;
    options.root = 2;
    options.chunk_bytes = chunk;
    broadcast_params(mine.views(), g, options);
    same[g.rank()] = mine == Buffers(2);
  }));
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(same[r]) << "rank " << r;
}

TEST_P(ChunkSizes, SyncBuffersAveragesFloatsAndBroadcastsIntegers) {
  const std::size_t chunk = GetParam();
  std::vector<Buffers> results(2, Buffers(0));
  expect_no_errors(on_ranks(2, [&](ProcessGroup& g) {
    Buffers mine(g.rank());
    SyncOptions options;
    options.chunk_bytes = chunk;
    sync_buffers(mine.views(), SyncMode::kAverage, g, options);
    results[g.rank()] = mine;
  }));
  for (const auto& s : results) {
    EXPECT_EQ(s.b, Buffers(0).b);  // integers: rank 0's values
    for (std::size_t i = 0; i < s.a.size(); ++i) ASSERT_EQ(s.a[i], 500.0f + i);
    for (std::size_t i = 0; i < s.c.size(); ++i) ASSERT_EQ(s.c[i], 0.5 + 0.25 * i);
    for (std::size_t i = 0; i < s.d.size(); ++i) ASSERT_EQ(bfloat16_to_float(s.d[i]), 1.0f + i);
  }
  EXPECT_TRUE(results[0] == results[1]);
}

// 250 MiB (everything packed), 64 bytes (packing and slicing), 1 byte (one
// element per collective).
INSTANTIATE_TEST_SUITE_P(Params, ChunkSizes, ::testing::Values(std::size_t{250} << 20, 64, 1));

TEST(SyncBuffers, BroadcastModeCopiesTheRoot) {
  std::vector<char> same(2);
  expect_no_errors(on_ranks(2, [&](ProcessGroup& g) {
    Buffers mine(g.rank());
    sync_buffers(mine.views(), SyncMode::kBroadcast, g);
    same[g.rank()] = mine == Buffers(0);
  }));
  EXPECT_TRUE(same[0] && same[1]);
}

TEST(BroadcastParams, NamesTheRankThatPassesOtherBuffers) {
  auto errors = on_ranks(3, [](ProcessGroup& g) {
    std::vector<float> data(g.rank() == 1 ? 99 : 100);
    broadcast_params({{data.data(), data.size(), DType::kFloat32}}, g);
  });
  for (const auto& e : errors) {
    EXPECT_EQ(e,
              "broadcast_params: rank 1's buffers differ from rank 0's: buffer 0: rank 1 has 99 "
              "float32, rank 0 "
              "has 100 float32 (check_same_params names the parameter)");
  }
}

TEST(BroadcastParams, ABadArgumentOnOneRankFailsEveryRankWithoutAHang) {
  auto errors = on_ranks(2, [](ProcessGroup& g) {
    std::vector<float> data(4);
    broadcast_params({{g.rank() == 1 ? nullptr : data.data(), data.size(), DType::kFloat32}}, g);
  });
  for (const auto& e : errors) {
    EXPECT_EQ(e, "broadcast_params: rank 1: buffer 0 has no data (nullptr) for 4 elements");
  }
}

TEST(BroadcastParams, ChecksArgumentsInAWorldOfOne) {
  if (!world_of_one()) GTEST_SKIP() << "needs a world of one";
  float x = 1;
  EXPECT_NO_THROW(broadcast_params({{&x, 1, DType::kFloat32}}));
  SyncOptions zero;
  zero.chunk_bytes = 0;
  EXPECT_THROW(broadcast_params({{&x, 1, DType::kFloat32}}, zero), Error);
  EXPECT_THROW(sync_buffers({{nullptr, 3, DType::kFloat32}}), Error);
}

// node_cpus(): the affinity mask (what taskset or a cpuset allows), not the
// machine's core count, set on this thread as sched_setaffinity(0, ...) does
// and restored after; DDP_NODE_CPUS (ddprun --bind_cores_to_rank) over both.
TEST(NodeCpus, FollowTheAffinityMaskUnlessDdprunSaysHowManyTheNodeSplit) {
  ASSERT_EQ(std::getenv("DDP_NODE_CPUS"), nullptr);
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  EXPECT_EQ(node_cpus(), CPU_COUNT(&before));
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int pinned = node_cpus();
  setenv("DDP_NODE_CPUS", "6", 1);
  const int split = node_cpus();  // a bound rank: its own mask is one CPU of six
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_EQ(pinned, 1);
  EXPECT_EQ(split, 6);
  for (const char* bad : {"0", "-2", "two", "3x"}) {
    setenv("DDP_NODE_CPUS", bad, 1);
    EXPECT_NE(
        testing::error_of([] { node_cpus(); }).find("DDP_NODE_CPUS='" + std::string(bad) + "'"),
        std::string::npos)
        << bad;
  }
  unsetenv("DDP_NODE_CPUS");
  EXPECT_EQ(node_cpus(), CPU_COUNT(&before));
}

}  // namespace
}  // namespace ddp
