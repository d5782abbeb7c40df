// The shm backend's algorithm bookkeeping (internal to libddp, pure): the
// variants each collective has, DDP_SHM_ALGO's syntax, size classes, the
// choice every rank derives from all ranks' timings, and the tune file.

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "backends/shm/algorithms.h"
#include "backends/shm/learned_choices.h"
#include "ddp/common/error.h"
#include "error_of.h"

namespace ddp::shm {
namespace {

using ::ddp::testing::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ShmVariants, EachCollectiveHasItsOwnAndSmallOnlyUpToTheSingleCopyLimit) {
  EXPECT_EQ(candidates(Collective::kAllReduce, 32 << 10, 32 << 10),
            (std::vector<Algorithm>{Algorithm::kPush, Algorithm::kPull, Algorithm::kChunked,
                                    Algorithm::kSmall}));
  EXPECT_EQ(candidates(Collective::kAllReduce, (32 << 10) + 1, 32 << 10),
            (std::vector<Algorithm>{Algorithm::kPush, Algorithm::kPull, Algorithm::kChunked}));
  EXPECT_EQ(candidates(Collective::kReduceScatter, 8, 32 << 10),
            (std::vector<Algorithm>{Algorithm::kPull, Algorithm::kChunked}));
  for (Collective c : {Collective::kAllGather, Collective::kBroadcast}) {
    EXPECT_EQ(candidates(c, 8, 32 << 10),
              (std::vector<Algorithm>{Algorithm::kPull, Algorithm::kPush, Algorithm::kChunked}));
  }
  for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                       Collective::kBroadcast}) {
    EXPECT_LE(variants(c).size(), kMaxVariants);
    EXPECT_EQ(collective_named(collective_name(c)), c);
  }
  EXPECT_EQ(collective_named("all-reduce"), std::nullopt);
}

TEST(ShmForced, AutoAndEmptyForceNothing) {
  for (const char* text : {"", "auto", "  auto "}) {
    const Forced f = parse_forced(text, "DDP_SHM_ALGO");
    EXPECT_EQ(f.packed(), 0u) << text;
    EXPECT_EQ(f.describe(), "auto");
  }
}

TEST(ShmForced, ABareNameForcesEveryCollectiveThatHasIt) {
  const Forced push = parse_forced("push", "DDP_SHM_ALGO");
  EXPECT_EQ(push.of(Collective::kAllReduce), Algorithm::kPush);
  EXPECT_EQ(push.of(Collective::kReduceScatter), Algorithm::kAuto);  // it has no push
  EXPECT_EQ(push.of(Collective::kAllGather), Algorithm::kPush);
  EXPECT_EQ(push.of(Collective::kBroadcast), Algorithm::kPush);
  EXPECT_EQ(push.describe(), "push");
  const Forced small = parse_forced("small", "DDP_SHM_ALGO");
  EXPECT_EQ(small.of(Collective::kAllReduce), Algorithm::kSmall);
  EXPECT_EQ(small.of(Collective::kBroadcast), Algorithm::kAuto);
  EXPECT_EQ(parse_forced("chunked", "x").describe(), "chunked");
}

TEST(ShmForced, PairsForceTheirCollectivesAndRoundTripThroughPacking) {
  const Forced f = parse_forced("all_reduce=pull, broadcast=push,all_gather=auto", "DDP_SHM_ALGO");
  EXPECT_EQ(f.of(Collective::kAllReduce), Algorithm::kPull);
  EXPECT_EQ(f.of(Collective::kBroadcast), Algorithm::kPush);
  EXPECT_EQ(f.of(Collective::kAllGather), Algorithm::kAuto);
  EXPECT_EQ(f.of(Collective::kReduceScatter), Algorithm::kAuto);
  EXPECT_EQ(f.describe(), "all_reduce=pull,broadcast=push");
  EXPECT_EQ(Forced::unpacked(f.packed()).by, f.by);
  EXPECT_NE(f.packed(), parse_forced("all_reduce=pull", "x").packed());
}

TEST(ShmForced, MalformedTextIsAnErrorNamingTheSourceAndWhatIsWrong) {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c :
       {Case{"fastest", "DDP_SHM_ALGO='fastest' is not auto, push, pull, chunked, small"},
        Case{"reduce_scatter=push", "reduce_scatter has no variant 'push' (auto, pull, chunked)"},
        Case{"all_reduce=", "all_reduce has no variant ''"},
        Case{"allreduce=pull", "'allreduce' is not one of all_reduce, reduce_scatter"},
        Case{"all_reduce=pull,chunked", "'chunked' is not COLLECTIVE=NAME"},
        Case{"broadcast=small", "broadcast has no variant 'small'"}}) {
    const std::string error = error_of([&] { parse_forced(c.text, "DDP_SHM_ALGO"); });
    EXPECT_TRUE(contains(error, c.expected)) << c.text << ": " << error;
    EXPECT_TRUE(contains(error, "DDP_SHM_ALGO")) << error;
  }
}

TEST(ShmSizeClasses, PowersOfTwoFrom1KiBTo16MiBThenOneForEverythingLarger) {
  EXPECT_EQ(size_class(1), kFirstClass);
  EXPECT_EQ(size_class(1024), kFirstClass);
  EXPECT_EQ(size_class(1025), 11);
  EXPECT_EQ(size_class(2048), 11);
  EXPECT_EQ(size_class(std::size_t{1} << 20), 20);
  EXPECT_EQ(size_class((std::size_t{1} << 20) + 1), 21);
  EXPECT_EQ(size_class(std::size_t{16} << 20), 24);
  EXPECT_EQ(size_class((std::size_t{16} << 20) + 1), kLastClass);
  EXPECT_EQ(size_class(std::size_t{1} << 40), kLastClass);
  EXPECT_EQ(class_limit(20), std::size_t{1} << 20);
  EXPECT_EQ(class_limit(kLastClass), std::numeric_limits<std::size_t>::max());
  for (std::size_t bytes : {1ul, 1000ul, 4097ul, 3ul << 20, 99ul << 20})
    EXPECT_LE(bytes, class_limit(size_class(bytes)));
}

TEST(ShmChoice, TheSlowestRanksTimeDecidesAndEveryRankGetsTheSameAnswer) {
  // Rank 0 finds candidate 0 fastest, rank 1 candidate 2; by the slowest
  // rank candidate 1 wins (its worst, 5, beats 9 and 7).
  const std::vector<std::vector<double>> seconds = {{1, 5, 7}, {9, 4, 2}};
  EXPECT_EQ(choose(seconds), 1u);
  // Whichever rank computes it, from the same table: the same index.
  const std::vector<std::vector<double>> swapped = {seconds[1], seconds[0]};
  EXPECT_EQ(choose(swapped), 1u);
  EXPECT_EQ(choose({{3, 3, 3}}), 0u);  // ties go to the first
  EXPECT_EQ(choose({{2, 1}, {2, 1}, {2, 3}}), 0u);
  EXPECT_NE(error_of([] { choose({}); }), "");
  EXPECT_NE(error_of([] { choose({{1, 2}, {1}}); }), "");
}

TEST(ShmChoice, AnUntimedClassTakesTheNearestClassThatCanRunIt) {
  const ChoiceTable table = {{{Collective::kAllReduce, 10}, Algorithm::kSmall},
                             {{Collective::kAllReduce, 14}, Algorithm::kPull},
                             {{Collective::kAllReduce, 18}, Algorithm::kPush},
                             {{Collective::kBroadcast, 24}, Algorithm::kChunked}};
  const std::size_t small = 32 << 10;
  EXPECT_EQ(nearest_choice(table, Collective::kAllReduce, 11, small), Algorithm::kSmall);
  EXPECT_EQ(nearest_choice(table, Collective::kAllReduce, 12, small), Algorithm::kSmall)
      << "a tie: the smaller";
  EXPECT_EQ(nearest_choice(table, Collective::kAllReduce, 16, small), Algorithm::kPull);
  EXPECT_EQ(nearest_choice(table, Collective::kAllReduce, kLastClass, small), Algorithm::kPush);
  // small cannot run calls above the single-copy limit: the next nearest instead.
  const ChoiceTable only_small = {{{Collective::kAllReduce, 10}, Algorithm::kSmall}};
  EXPECT_EQ(nearest_choice(only_small, Collective::kAllReduce, 15, small), Algorithm::kSmall);
  EXPECT_EQ(nearest_choice(only_small, Collective::kAllReduce, 16, small), std::nullopt);
  EXPECT_EQ(nearest_choice(table, Collective::kAllGather, 10, small), std::nullopt);
  EXPECT_EQ(nearest_choice(table, Collective::kBroadcast, 10, small), Algorithm::kChunked);
}

TEST(ShmChoice, TheTimingBudgetIsMillisecondsOrAnErrorNamingTheVariable) {
  EXPECT_EQ(parse_timing_budget(""), kDefaultTimingBudgetMs);
  EXPECT_EQ(parse_timing_budget("0"), 0.0);
  EXPECT_EQ(parse_timing_budget(" 12.5 "), 12.5);
  for (const char* bad : {"-1", "fast", "5ms", "nan"}) {
    const std::string error = error_of([&] { parse_timing_budget(bad); });
    EXPECT_TRUE(contains(error, "DDP_SHM_TUNE_BUDGET_MS='")) << bad << ": " << error;
    EXPECT_TRUE(contains(error, "is not a number of milliseconds >= 0")) << error;
  }
}

TEST(ShmTuneFile, ParsesLinesSkipsCommentsAndFormatsBackTheSame) {
  const std::string text =
      "# a comment\n"
      "\n"
      "all_reduce 2 1024 small\n"
      "all_reduce 2 1048576 pull\n"
      "  broadcast 4 larger chunked  \n"
      "reduce_scatter 2 65536 chunked\r\n";
  const auto entries = parse_tune_file(text, "/etc/tune");
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0], (TuneEntry{Collective::kAllReduce, 2, 10, Algorithm::kSmall}));
  EXPECT_EQ(entries[1], (TuneEntry{Collective::kAllReduce, 2, 20, Algorithm::kPull}));
  EXPECT_EQ(entries[2], (TuneEntry{Collective::kBroadcast, 4, kLastClass, Algorithm::kChunked}));
  const ChoiceTable two = table_for(entries, 2);
  EXPECT_EQ(two.size(), 3u);
  EXPECT_EQ(two.at({Collective::kAllReduce, 20}), Algorithm::kPull);
  EXPECT_EQ(table_for(entries, 4).at({Collective::kBroadcast, kLastClass}), Algorithm::kChunked);
  const std::string formatted = format_tune_file(merged(entries, 2, {}), "timed on a CPU");
  EXPECT_TRUE(contains(formatted, "timed on a CPU")) << formatted;
  EXPECT_EQ(parse_tune_file(formatted, "again"), merged(entries, 2, {}));
}

TEST(ShmTuneFile, MergingKeepsOtherRankCountsAndReplacesThisOnesClasses) {
  const auto entries = parse_tune_file("all_reduce 2 1024 small\nall_reduce 4 1024 pull\n", "f");
  const ChoiceTable timed = {{{Collective::kAllReduce, 10}, Algorithm::kChunked},
                             {{Collective::kAllGather, 24}, Algorithm::kPush}};
  const auto out = merged(entries, 2, timed);
  EXPECT_EQ(out, (std::vector<TuneEntry>{{Collective::kAllReduce, 2, 10, Algorithm::kChunked},
                                         {Collective::kAllGather, 2, 24, Algorithm::kPush},
                                         {Collective::kAllReduce, 4, 10, Algorithm::kPull}}));
  // A class named twice counts once: the last line, as when it was read.
  const auto twice = parse_tune_file("all_reduce 2 1024 small\nall_reduce 2 1024 pull\n", "f");
  EXPECT_EQ(table_for(twice, 2).at({Collective::kAllReduce, 10}), Algorithm::kPull);
  EXPECT_EQ(merged(twice, 2, {}),
            (std::vector<TuneEntry>{{Collective::kAllReduce, 2, 10, Algorithm::kPull}}));
}

TEST(ShmTuneFile, AMalformedLineIsAnErrorNamingTheFileTheLineAndTheField) {
  struct Case {
    const char* line;
    const char* expected;
  };
  for (const Case& c :
       {Case{"all_reduce 2 1024", "expected COLLECTIVE RANKS MAX_BYTES ALGORITHM"},
        Case{"all_reduce 2 1024 pull extra", "expected COLLECTIVE RANKS MAX_BYTES ALGORITHM"},
        Case{"allreduce 2 1024 pull", "no collective 'allreduce'"},
        Case{"all_reduce 1 1024 pull", "RANKS '1' is not a whole number of at least 2"},
        Case{"all_reduce two 1024 pull", "RANKS 'two'"},
        Case{"all_reduce 2 1000 pull", "MAX_BYTES '1000' is not a power of two"},
        Case{"all_reduce 2 512 pull", "MAX_BYTES '512'"},
        Case{"all_reduce 2 33554432 pull", "MAX_BYTES '33554432'"},
        Case{"all_reduce 2 1024 auto", "all_reduce has no variant 'auto'"},
        Case{"reduce_scatter 2 1024 push",
             "reduce_scatter has no variant 'push' (pull, chunked)"}}) {
    const std::string error =
        error_of([&] { parse_tune_file(std::string("# header\n") + c.line + "\n", "/x/tune"); });
    EXPECT_TRUE(contains(error, "shm tune file /x/tune line 2")) << error;
    EXPECT_TRUE(contains(error, c.expected)) << c.line << ": " << error;
  }
}

TEST(ShmLearnedChoices, EachClassTakesTheLowestLocalRankThatHasAChoice) {
  const int mib = size_class(1 << 20), kib = size_class(1 << 10);
  const PackedChoices none{};  // a relaunched process: it learned nothing
  const PackedChoices first = pack({{{Collective::kAllReduce, mib}, Algorithm::kPull}});
  const PackedChoices second = pack({{{Collective::kAllReduce, mib}, Algorithm::kPush},
                                     {{Collective::kBroadcast, kib}, Algorithm::kChunked}});
  const ChoiceTable want = {{{Collective::kAllReduce, mib}, Algorithm::kPull},
                            {{Collective::kBroadcast, kib}, Algorithm::kChunked}};
  EXPECT_EQ(agreed({none, first, second}), want);
  EXPECT_EQ(agreed({none}), ChoiceTable{});
  // A byte that names no variant of its collective (small is all_reduce's only) is skipped.
  PackedChoices odd{};
  odd[static_cast<int>(Collective::kBroadcast)][kib - kFirstClass] =
      static_cast<std::uint8_t>(Algorithm::kSmall);
  odd[static_cast<int>(Collective::kAllGather)][0] = 200;
  EXPECT_EQ(agreed({odd, second}), agreed({second}));
}

TEST(ShmLearnedChoices, AreKeptPerRunRoundAndShape) {
  const ChoiceScope scope{"learned-test", 2, 4, 32 << 10, 256 << 10};
  ChoiceScope other_shape = scope;
  other_shape.local_size = 3;
  ChoiceScope other_round = scope;
  other_round.round = 3;
  learn_choice(scope, Collective::kAllReduce, kLastClass, Algorithm::kChunked);
  const ChoiceTable want = {{{Collective::kAllReduce, kLastClass}, Algorithm::kChunked}};
  EXPECT_EQ(learned_choices(scope), want);
  EXPECT_EQ(learned_choices(other_shape), ChoiceTable{});
  EXPECT_EQ(learned_choices(other_round), ChoiceTable{});
}

}  // namespace
}  // namespace ddp::shm
