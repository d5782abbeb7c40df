// libddp's collectives with every rank a thread of this process: Gloo groups
// over one in-memory store (each test under its own prefix), results checked
// element by element against values computed here. Fast enough to sweep every
// collective, dtype, op, root and awkward count for worlds of 2, 3 and 4.

#include <gtest/gtest.h>

#include "thread_ranks.h"
#include "typed_buffer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

using ::ddp::testing::Buffer;
using ::ddp::testing::input_value;
using ::ddp::testing::is_float;
using ::ddp::testing::is_signed;
using ::ddp::testing::kCounts;
using ::ddp::testing::kDTypes;
using ::ddp::testing::kOps;
using ::ddp::testing::moved_value;
using ::ddp::testing::reference;

using ::ddp::testing::check_all_gather;
using ::ddp::testing::check_broadcast_from_every_root;
using ::ddp::testing::check_reduce;
using ::ddp::testing::expect_elements;
using ::ddp::testing::label;

using ::ddp::testing::gloo_options;
using ::ddp::testing::on_ranks;

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(Collectives, AllReduceMatchesLocalReferenceForEveryDtypeOpAndCount) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    for (DType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        for (std::size_t count : kCounts) {
          Buffer buf(dtype, count);
          buf.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, dtype); });
          pg.all_reduce(buf.data(), count, dtype, op);
          expect_elements(
              buf, 0, count,
              [&](std::size_t i) {
                return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
              },
              label(pg.rank(), std::string("all_reduce ") + op_name(op), count));
        }
      }
    }
  });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  on_ranks(world(), [](ProcessGroup& pg) {
    check_broadcast_from_every_root(
        pg, [](DType) { return std::vector<std::size_t>(std::begin(kCounts), std::end(kCounts)); });
  });
}

TEST_P(Collectives, ReduceLandsOnEveryRootAndLeavesOthersUnchanged) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    for (DType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        for (int root = 0; root < n; ++root) {
          for (std::size_t count : {std::size_t{1}, std::size_t{7}})
            check_reduce(pg, dtype, op, root, count);
        }
      }
    }
    // Zero elements and a long buffer, once.
    for (std::size_t count : {std::size_t{0}, std::size_t{1001}}) {
      Buffer buf(DType::kInt64, count);
      buf.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kInt64); });
      pg.reduce(buf.data(), count, DType::kInt64, ReduceOp::kSum, n - 1);
      expect_elements(
          buf, 0, count,
          [&](std::size_t i) {
            if (pg.rank() != n - 1) return input_value(pg.rank(), i, DType::kInt64);
            return reference(ReduceOp::kSum, DType::kInt64, n,
                             [&](int r) { return input_value(r, i, DType::kInt64); });
          },
          label(pg.rank(), "reduce sum to the last rank", count));
    }
  });
}

TEST_P(Collectives, AllGatherPutsEveryRanksInputInRankOrder) {
  on_ranks(world(), [](ProcessGroup& pg) {
    check_all_gather(
        pg, [](DType) { return std::vector<std::size_t>(std::begin(kCounts), std::end(kCounts)); });
  });
}

TEST_P(Collectives, GatherToEveryRootWithNullOutputElsewhere) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    for (DType dtype : kDTypes) {
      for (int root = 0; root < n; ++root) {
        for (std::size_t count : kCounts) {
          Buffer in(dtype, count), out(dtype, count * n);
          in.fill(0, count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
          pg.gather(in.data(), pg.rank() == root ? out.data() : nullptr, count, dtype, root);
          if (pg.rank() != root) continue;
          for (int r = 0; r < n; ++r) {
            expect_elements(
                out, r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
                label(pg.rank(),
                      "gather to root " + std::to_string(root) + ", slice " + std::to_string(r),
                      count));
          }
        }
      }
    }
  });
}

TEST_P(Collectives, ScatterFromEveryRootWithNullInputElsewhere) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    for (DType dtype : kDTypes) {
      for (int root = 0; root < n; ++root) {
        for (std::size_t count : kCounts) {
          Buffer in(dtype, count * n), out(dtype, count);
          in.fill(0, count * n, [&](std::size_t k) { return moved_value(root, k, dtype); });
          out.fill(0, count, [](std::size_t) { return 0.0; });
          pg.scatter(pg.rank() == root ? in.data() : nullptr, out.data(), count, dtype, root);
          const std::size_t first = pg.rank() * count;
          expect_elements(
              out, 0, count, [&](std::size_t i) { return moved_value(root, first + i, dtype); },
              label(pg.rank(), "scatter from root " + std::to_string(root), count));
        }
      }
    }
  });
}

TEST_P(Collectives, AllToAllSendsSliceJOfRankIToSliceIOfRankJ) {
  const int n = world();
  auto value = moved_value;
  on_ranks(n, [n, value](ProcessGroup& pg) {
    for (DType dtype : kDTypes) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count * n), out(dtype, count * n);
        in.fill(0, count * n, [&](std::size_t k) { return value(pg.rank(), k, dtype); });
        pg.all_to_all(in.data(), out.data(), count, dtype);
        for (int i = 0; i < n; ++i) {
          // Slice i of mine = slice rank() of rank i's input.
          expect_elements(
              out, i * count, count,
              [&](std::size_t j) { return value(i, pg.rank() * count + j, dtype); },
              label(pg.rank(), "all_to_all slice from rank " + std::to_string(i), count));
        }
      }
    }
  });
}

TEST_P(Collectives, ReduceScatterGivesEachRankItsReducedSliceForEveryOp) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    for (DType dtype : kDTypes) {
      for (ReduceOp op : kOps) {
        for (std::size_t count : kCounts) {
          Buffer in(dtype, count * n), out(dtype, count);
          in.fill(0, count * n, [&](std::size_t k) { return input_value(pg.rank(), k, dtype); });
          pg.reduce_scatter(in.data(), out.data(), count, dtype, op);
          const std::size_t first = pg.rank() * count;
          expect_elements(
              out, 0, count,
              [&](std::size_t i) {
                return reference(op, dtype, n,
                                 [&](int r) { return input_value(r, first + i, dtype); });
              },
              label(pg.rank(), std::string("reduce_scatter ") + op_name(op), count));
        }
      }
    }
  });
}

TEST_P(Collectives, BarrierHoldsEveryRankUntilAllArrive) {
  const int n = world();
  std::atomic<int> arrived{0};
  on_ranks(n, [n, &arrived](ProcessGroup& pg) {
    for (int round = 1; round <= 5; ++round) {
      // The last rank is late each round; nobody may pass before it arrives.
      if (pg.rank() == n - 1) std::this_thread::sleep_for(20ms);
      arrived.fetch_add(1);
      pg.barrier();
      EXPECT_GE(arrived.load(), round * n)
          << "rank " << pg.rank() << " passed barrier " << round << " early";
      pg.barrier();  // nobody starts the next round before everyone checked this one
    }
  });
}

TEST_P(Collectives, BroadcastObjectOfAnyLengthFromEveryRoot) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t length :
           {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{70000}}) {
        std::string expected(length, '\0');
        for (std::size_t i = 0; i < length; ++i)
          expected[i] = static_cast<char>((i * 31 + root) % 256);
        // Non-roots start with something of another length.
        std::string bytes = pg.rank() == root ? expected : std::string(pg.rank() + 5, 'x');
        pg.broadcast_object(bytes, root);
        EXPECT_EQ(bytes, expected) << "rank " << pg.rank() << ": broadcast_object of " << length
                                   << " bytes from root " << root;
      }
    }
  });
}

TEST_P(Collectives, AllGatherObjectKeepsEachRanksLengthIncludingEmpty) {
  const int n = world();
  auto object_of = [](int r) {
    std::string s(static_cast<std::size_t>(r) * 3,
                  '\0');  // rank 0: empty; binary bytes, NULs included
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(r * 40 + i);
    return s;
  };
  on_ranks(n, [n, object_of](ProcessGroup& pg) {
    auto all = pg.all_gather_object(object_of(pg.rank()));
    ASSERT_EQ(static_cast<int>(all.size()), n);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(all[r], object_of(r)) << "rank " << pg.rank() << ", object of rank " << r;
    // Every rank empty.
    auto empty = pg.all_gather_object("");
    EXPECT_EQ(empty, std::vector<std::string>(n));
    // Only the last rank has something.
    auto last = pg.all_gather_object(pg.rank() == n - 1 ? "last" : "");
    for (int r = 0; r < n; ++r) EXPECT_EQ(last[r], r == n - 1 ? "last" : "");
  });
}

TEST_P(Collectives, ZeroCountCollectivesAcceptNullBuffers) {
  const int n = world();
  on_ranks(n, [](ProcessGroup& pg) {
    pg.all_reduce(nullptr, 0, DType::kFloat32);
    pg.broadcast(nullptr, 0, DType::kFloat32, 0);
    pg.reduce(nullptr, 0, DType::kInt32, ReduceOp::kMax, 0);
    pg.all_gather(nullptr, nullptr, 0, DType::kUInt8);
    pg.gather(nullptr, nullptr, 0, DType::kUInt8, 0);
    pg.scatter(nullptr, nullptr, 0, DType::kUInt8, 0);
    pg.all_to_all(nullptr, nullptr, 0, DType::kInt64);
    pg.reduce_scatter(nullptr, nullptr, 0, DType::kFloat64, ReduceOp::kSum);
    // The group is still in step afterwards.
    std::int32_t one = 1;
    pg.all_reduce(&one, 1, DType::kInt32);
    EXPECT_EQ(one, pg.size());
  });
}

TEST_P(Collectives, AsyncOpsIssuedTogetherAllCompleteWithCorrectResults) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    const std::size_t count = 7;
    Buffer a(DType::kFloat32, count), b(DType::kInt64, count), c(DType::kBFloat16, count);
    Buffer gathered(DType::kInt32, count * n), mine(DType::kInt32, count);
    Buffer rs_in(DType::kFloat64, count * n), rs_out(DType::kFloat64, count);
    a.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kFloat32); });
    b.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kInt64); });
    c.fill(0, count, [&](std::size_t i) { return moved_value(pg.rank(), i, DType::kBFloat16); });
    mine.fill(0, count, [&](std::size_t i) { return moved_value(pg.rank(), i, DType::kInt32); });
    rs_in.fill(0, count * n,
               [&](std::size_t k) { return input_value(pg.rank(), k, DType::kFloat64); });

    std::vector<std::shared_ptr<Work>> works;
    works.push_back(pg.all_reduce_async(a.data(), count, DType::kFloat32, ReduceOp::kSum));
    works.push_back(pg.all_reduce_async(b.data(), count, DType::kInt64, ReduceOp::kMax));
    works.push_back(pg.broadcast_async(c.data(), count, DType::kBFloat16, n - 1));
    works.push_back(pg.all_gather_async(mine.data(), gathered.data(), count, DType::kInt32));
    works.push_back(pg.barrier_async());
    works.push_back(pg.reduce_scatter_async(rs_in.data(), rs_out.data(), count, DType::kFloat64,
                                            ReduceOp::kMin));
    EXPECT_EQ(works[0]->description(), "all_reduce of 7 float32 (sum)");
    // Wait in reverse: the last finishing implies the others finished (issue order).
    for (auto it = works.rbegin(); it != works.rend(); ++it)
      EXPECT_TRUE((*it)->wait(10s)) << (*it)->description();
    for (auto& w : works) {
      EXPECT_TRUE(w->is_completed()) << w->description();
      EXPECT_TRUE(w->wait()) << w->description();  // waiting again returns at once
    }
    auto ref = [&](ReduceOp op, DType dtype, std::size_t i) {
      return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
    };
    expect_elements(
        a, 0, count, [&](std::size_t i) { return ref(ReduceOp::kSum, DType::kFloat32, i); },
        "async all_reduce sum");
    expect_elements(
        b, 0, count, [&](std::size_t i) { return ref(ReduceOp::kMax, DType::kInt64, i); },
        "async all_reduce max");
    expect_elements(
        c, 0, count, [&](std::size_t i) { return moved_value(n - 1, i, DType::kBFloat16); },
        "async broadcast");
    for (int r = 0; r < n; ++r) {
      expect_elements(
          gathered, r * count, count,
          [&](std::size_t i) { return moved_value(r, i, DType::kInt32); }, "async all_gather");
    }
    expect_elements(
        rs_out, 0, count,
        [&](std::size_t i) { return ref(ReduceOp::kMin, DType::kFloat64, pg.rank() * count + i); },
        "async reduce_scatter min");
  });
}

TEST_P(Collectives, AsyncWorkIsNotCompletedUntilEveryRankJoins) {
  const int n = world();
  std::latch rank0_checked(1);
  on_ranks(n, [n, &rank0_checked](ProcessGroup& pg) {
    std::int32_t value = pg.rank() + 1;
    if (pg.rank() == 0) {
      auto work = pg.all_reduce_async(&value, 1, DType::kInt32);
      // The others issue theirs only after this check: it cannot have finished.
      EXPECT_FALSE(work->is_completed());
      EXPECT_FALSE(work->wait(30ms));
      rank0_checked.count_down();
      EXPECT_TRUE(work->wait(10s));
      EXPECT_TRUE(work->is_completed());
    } else {
      rank0_checked.wait();
      pg.all_reduce_async(&value, 1, DType::kInt32)->wait();
    }
    EXPECT_EQ(value, n * (n + 1) / 2);
  });
}

TEST_P(Collectives, LargeOddBuffersReduceExactly) {
  const int n = world();
  const std::size_t count =
      100003;  // ~400 KB of float32: many Gloo segments, not divisible by any world
  on_ranks(n, [n, count](ProcessGroup& pg) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        auto expected = [&](std::size_t i) {
          return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
        };
        Buffer buf(dtype, count);
        buf.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, dtype); });
        pg.all_reduce(buf.data(), count, dtype, op);
        expect_elements(buf, 0, count, expected,
                        label(pg.rank(), std::string("all_reduce ") + op_name(op), count));

        Buffer red(dtype, count);
        red.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, dtype); });
        pg.reduce(red.data(), count, dtype, op, n - 1);
        expect_elements(
            red, 0, count,
            [&](std::size_t i) {
              return pg.rank() == n - 1 ? expected(i) : input_value(pg.rank(), i, dtype);
            },
            label(pg.rank(), std::string("reduce ") + op_name(op), count));
      }
    }
  });
}

TEST_P(Collectives, ConcurrentIssuersOnEveryRankAllComplete) {
  const int n = world();
  on_ranks(n, [n](ProcessGroup& pg) {
    // Four threads per rank issue identical all_reduces at once. Which thread's
    // call pairs with which on other ranks is up to the order they reach the
    // group, so every buffer of rank r holds r + 1 and every sum is the same.
    constexpr int kThreads = 4, kRounds = 10;
    std::vector<std::thread> issuers;
    std::vector<std::vector<std::int32_t>> results(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      issuers.emplace_back([&, t] {
        for (int round = 0; round < kRounds; ++round) {
          std::vector<std::int32_t> data(5, pg.rank() + 1);
          pg.all_reduce(data.data(), data.size(), DType::kInt32);
          results[t].insert(results[t].end(), data.begin(), data.end());
        }
      });
    }
    for (auto& t : issuers) t.join();
    for (const auto& r : results) {
      EXPECT_EQ(r, std::vector<std::int32_t>(5 * kRounds, n * (n + 1) / 2)) << "rank " << pg.rank();
    }
  });
}

TEST_P(Collectives, DebugCheckNamesTheRankWithADifferentCountAndTheGroupGoesOn) {
  const int n = world();
  auto options = gloo_options();
  options.debug_checks = true;
  std::vector<std::string> errors(n);
  auto start = std::chrono::steady_clock::now();
  on_ranks(
      n,
      [&errors](ProcessGroup& pg) {
        std::vector<float> data(8, 1.0f);
        const std::size_t count = pg.rank() == 1 ? 5 : 4;
        try {
          pg.all_reduce(data.data(), count, DType::kFloat32);
          ADD_FAILURE() << "rank " << pg.rank() << ": a mismatched all_reduce succeeded";
        } catch (const Error& e) {
          errors[pg.rank()] = e.what();
        }
        // The async form reports the same error from wait(), every time it is asked.
        auto work = pg.all_reduce_async(data.data(), pg.rank() == 1 ? 3 : 2, DType::kFloat32);
        EXPECT_THROW(work->wait(10s), Error);
        EXPECT_TRUE(work->is_completed());
        EXPECT_THROW(work->wait(), Error);
        // Nobody ran the mismatched collectives: the group is still in step.
        std::vector<float> ok(4, 1.0f);
        pg.all_reduce(ok.data(), ok.size(), DType::kFloat32);
        EXPECT_EQ(ok[3], static_cast<float>(pg.size()));
      },
      options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s)
      << "a mismatch must fail fast, not wait for the timeout";
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
    EXPECT_NE(errors[r].find("all_reduce"), std::string::npos);
    EXPECT_NE(errors[r].find("mismatch"), std::string::npos);
    EXPECT_NE(errors[r].find("rank(s) 1 differ"), std::string::npos);
    EXPECT_NE(errors[r].find("rank 1 has count 5"), std::string::npos);
  }
}

TEST_P(Collectives, DebugCheckNamesTheMinorityEvenWhenItIsRankZero) {
  const int n = world();
  auto options = gloo_options();
  options.debug_checks = true;
  std::vector<std::string> errors(n);
  on_ranks(
      n,
      [&errors](ProcessGroup& pg) {
        std::int64_t data[2] = {1, 1};
        try {
          if (pg.rank() == 0) {
            pg.broadcast(data, 2, DType::kInt64, 0);
          } else {
            pg.all_reduce(data, 2, DType::kInt64);
          }
          ADD_FAILURE() << "rank " << pg.rank() << ": mismatched collectives succeeded";
        } catch (const Error& e) {
          errors[pg.rank()] = e.what();
        }
      },
      options);
  // With two ranks it is one against one: the lowest rank is the reference.
  const std::string odd = n == 2 ? "1" : "0";
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
    EXPECT_NE(errors[r].find("rank(s) " + odd + " differ"), std::string::npos);
    EXPECT_NE(errors[r].find("a different collective"), std::string::npos);
  }
}

// on_finish: set before the collective finishes, it runs once on the
// group's thread, before wait() returns, and sees the result in the buffer;
// set after, it runs at once on the caller's thread.
TEST_P(Collectives, OnFinishRunsOnceBeforeWaitReturnsAndAtOnceWhenAlreadyDone) {
  const int n = world();
  std::latch rank0_set(1);
  on_ranks(n, [n, &rank0_set](ProcessGroup& pg) {
    std::int32_t value = pg.rank() + 1;
    std::atomic<int> calls{0};
    std::int32_t seen = 0;
    std::thread::id ran_on;
    if (pg.rank() != 0) rank0_set.wait();
    auto work = pg.all_reduce_async(&value, 1, DType::kInt32);
    work->on_finish([&](std::exception_ptr error) {
      EXPECT_EQ(error, nullptr);
      seen = value;
      ran_on = std::this_thread::get_id();
      ++calls;
    });
    if (pg.rank() == 0) rank0_set.count_down();
    EXPECT_TRUE(work->wait(10s));
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(seen, n * (n + 1) / 2);
    if (pg.rank() == 0) {
      EXPECT_NE(ran_on, std::this_thread::get_id()) << "the others issued theirs later";
    }
    std::thread::id second_ran_on;
    work->on_finish([&](std::exception_ptr) { second_ran_on = std::this_thread::get_id(); });
    EXPECT_EQ(second_ran_on, std::this_thread::get_id()) << "already done: runs at once, here";
    EXPECT_EQ(calls.load(), 1);
  });
}

TEST_P(Collectives, TimeoutNamesTheCollectiveItsSizeAndTheRanksThatNeverArrived) {
  const int n = world();
  // The last rank stays away; in a world of 4, rank 1 too.
  const std::vector<int> absent = n == 4 ? std::vector<int>{1, 3} : std::vector<int>{n - 1};
  const std::string absent_list = n == 4 ? "1, 3" : std::to_string(n - 1);
  auto is_absent = [&](int r) {
    return std::find(absent.begin(), absent.end(), r) != absent.end();
  };
  std::vector<std::string> errors(n);
  std::latch others_done(n - static_cast<int>(absent.size()));
  auto start = std::chrono::steady_clock::now();
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        if (is_absent(pg.rank())) {
          // Never calls all_reduce; keeps its group alive until the others gave up.
          others_done.wait();
          return;
        }
        std::vector<double> data(6, 1.0);
        try {
          pg.all_reduce(data.data(), data.size(), DType::kFloat64);
          ADD_FAILURE() << "rank " << pg.rank() << ": all_reduce without ranks " << absent_list
                        << " succeeded";
        } catch (const Error& e) {
          errors[pg.rank()] = e.what();
        }
        others_done.count_down();
      },
      gloo_options(1s));
  // 1 s collective timeout, then at most 1 s asking the store who arrived.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int r = 0; r < n; ++r) {
    if (is_absent(r)) continue;
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
    EXPECT_NE(errors[r].find("rank " + std::to_string(r) + ": all_reduce of 6 float64 (sum)"),
              std::string::npos);
    EXPECT_NE(errors[r].find("ranks that had not arrived: " + absent_list), std::string::npos);
  }
}

TEST(GroupCreation, FailsWithinTheTimeoutWhenARankNeverJoins) {
  auto store = make_prefix_store(make_memory_store(), "never-joins");
  auto start = std::chrono::steady_clock::now();
  std::string error = "(no error)";
  try {
    ProcessGroup::create(0, 2, store, gloo_options(1s));
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_NE(error, "(no error)");
  // Gloo waited for rank 1's address: the error names its key and the time waited.
  EXPECT_NE(error.find("never-joins/1"), std::string::npos) << error;
  EXPECT_NE(error.find("1000 ms"), std::string::npos) << error;
}

INSTANTIATE_TEST_SUITE_P(Worlds, Collectives, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace ddp
