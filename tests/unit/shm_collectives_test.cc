// libddp's shm backend with every rank a thread of this process: each rank
// maps the node's shared segment itself (as a process would), the ranks find
// it through one in-memory store, and every result is checked element by
// element against values computed here. Covers every path of all_reduce
// (small single-copy, chunked private, zero-copy in allocate()d memory, and
// the mixes), every dtype and op, the shm collectives and the Gloo fallbacks,
// bit-identical float results, mismatches and timeouts, allocate(), the arena
// allocator, hierarchical all-reduce with ranks placed on simulated nodes,
// and that no /dev/shm entry of a test's run is left behind.
// Over 600 lines because every algorithm path (sizes around each threshold,
// in place and private, every dtype and op) shares the thread-rank fixtures here.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backends/shm/arena.h"
#include "collective_checks.h"
#include "ddp/common/error.h"
#include "ddp/common/shm_names.h"
#include "ddp/process_group.h"
#include "error_of.h"
#include "scoped_env.h"
#include "shm_segments.h"
#include "thread_ranks.h"
#include "typed_buffer.h"

namespace ddp {
namespace {

using ::ddp::testing::shm_segments_of;

using namespace std::chrono_literals;
using ::ddp::testing::Buffer;
using ::ddp::testing::check_all_gather;
using ::ddp::testing::check_broadcast_from_every_root;
using ::ddp::testing::check_reduce;
using ::ddp::testing::expect_elements;
using ::ddp::testing::input_value;
using ::ddp::testing::kDTypes;
using ::ddp::testing::kOps;
using ::ddp::testing::label;
using ::ddp::testing::moved_value;
using ::ddp::testing::on_ranks;
using ::ddp::testing::reference;
using ::ddp::testing::ScopedEnv;  // the shm backend reads DDP_SHM_* when a segment is made

constexpr std::size_t kSmallBytes = 32 << 10;  // the backend's single-copy limit
constexpr std::size_t kChunkKiB = 64;          // DDP_SHM_CHUNK_KB in the sweeps (its minimum)

// ---- Helpers ------------------------------------------------------------------------------

// A run id no other test (or test process) uses: letters and digits only, so
// its /dev/shm prefix is exactly "ddp-<run id>-".
std::string unique_run_id() {
  static std::atomic<int> runs{0};
  return "shmt" + std::to_string(getpid()) + "x" + std::to_string(runs++);
}

using ::ddp::testing::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

double all_reduce_reference(ReduceOp op, DType dtype, int world, std::size_t i) {
  return reference(op, dtype, world, [&](int r) { return input_value(r, i, dtype); });
}

// Where a collective's buffer lives: private memory (the copying paths), memory
// from allocate() on every rank (zero-copy), or allocate() on even ranks only
// (not every buffer is in the segment: the copying path again).
enum class Memory { kPrivate, kShared, kMixed };
constexpr Memory kMemories[] = {Memory::kPrivate, Memory::kShared, Memory::kMixed};
const char* memory_name(Memory m) {
  switch (m) {
    case Memory::kPrivate:
      return "private";
    case Memory::kShared:
      return "allocate()d";
    case Memory::kMixed:
      return "allocate()d on even ranks";
  }
  return "?";
}
bool in_segment(Memory m, int rank) {
  return m == Memory::kShared || (m == Memory::kMixed && rank % 2 == 0);
}

// Float counts for the memory-mix tests: one, odd, and several chunks plus a remainder.
constexpr std::size_t kMixCounts[] = {1, 1001, 3 * (kChunkKiB << 8) + 5};

// `count` floats in the memory asked for this rank: from allocate() or its own.
struct Floats {
  Floats(ProcessGroup& pg, Memory memory, std::size_t count) {
    if (in_segment(memory, pg.rank())) {
      block = pg.allocate(count * sizeof(float));
      data = static_cast<float*>(block.get());
    } else {
      own.resize(count);
      data = own.data();
    }
  }
  std::shared_ptr<void> block;
  std::vector<float> own;
  float* data = nullptr;
};

// all_reduce of `buf` in place, in the memory asked for; the result ends in `buf`.
void all_reduce_in(ProcessGroup& pg, Buffer& buf, ReduceOp op, Memory memory) {
  if (!in_segment(memory, pg.rank()))
    return pg.all_reduce(buf.data(), buf.count(), buf.dtype(), op);
  const std::size_t bytes = buf.count() * dtype_size(buf.dtype());
  std::shared_ptr<void> block = pg.allocate(bytes);
  std::memcpy(block.get(), buf.data(), bytes);
  pg.all_reduce(block.get(), buf.count(), buf.dtype(), op);
  std::memcpy(buf.data(), block.get(), bytes);
}

// Counts for a dtype that hit every boundary of the shm paths (with chunks of
// kChunkKiB): none, one, odd, divisible by no world, exactly the single-copy
// limit and one element past it, and several chunks plus a remainder so short
// that most ranks' slices of the last chunk are empty.
std::vector<std::size_t> boundary_counts(DType dtype) {
  const std::size_t e = dtype_size(dtype), per_chunk = (kChunkKiB << 10) / e;
  return {0, 1, 7, 1001, kSmallBytes / e, kSmallBytes / e + 1, 2 * per_chunk + 13};
}

// Fills a float32 element with an integer in [-512, 511] that looks random
// across positions and ranks: sums over 4 ranks stay exact.
inline float large_value(int rank, std::size_t i) {
  auto x = static_cast<std::uint32_t>(i + static_cast<std::size_t>(rank) * 977u) * 2654435761u;
  return static_cast<float>(static_cast<int>((x >> 11) & 1023u) - 512);
}

// ---- Fixtures ----------------------------------------------------------------------------

class Shm : public ::testing::Test {
 protected:
  ProcessGroupOptions options(std::chrono::milliseconds timeout = 30s) const {
    ProcessGroupOptions o;
    o.backend = "shm";
    o.timeout = timeout;
    o.run_id = run_id_;
    return o;
  }
  // Every group of the test is gone by now: so must be every segment of its run.
  void TearDown() override {
    EXPECT_EQ(shm_segments_of(run_id_), std::vector<std::string>{})
        << "segments of run " << run_id_ << " left in /dev/shm";
  }
  const std::string run_id_ = unique_run_id();
};

class ShmWorlds : public Shm, public ::testing::WithParamInterface<int> {
 protected:
  int world() const { return GetParam(); }
};

// A world size and a DDP_SHM_ALGO setting (the group's shm_algorithm): every
// path an algorithm variant takes, and the variants the ranks time and agree
// on by themselves (auto).
class ShmVariants : public Shm, public ::testing::WithParamInterface<std::tuple<int, std::string>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  ProcessGroupOptions options() const {
    ProcessGroupOptions o = Shm::options();
    o.shm_algorithm = std::get<1>(GetParam());
    return o;
  }
};

// ---- all_reduce -------------------------------------------------------------------------

TEST_P(ShmVariants, AllReduceMatchesReferenceForEveryDtypeOpBoundaryCountAndMemory) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        EXPECT_EQ(pg.backend_name(), "shm");
        for (DType dtype : kDTypes) {
          for (std::size_t count : boundary_counts(dtype)) {
            for (ReduceOp op : kOps) {
              for (Memory memory : kMemories) {
                Buffer buf(dtype, count);
                buf.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, dtype); });
                all_reduce_in(pg, buf, op, memory);
                expect_elements(
                    buf, 0, count,
                    [&](std::size_t i) { return all_reduce_reference(op, dtype, n, i); },
                    label(pg.rank(),
                          std::string("all_reduce ") + op_name(op) + " in " + memory_name(memory),
                          count));
              }
            }
          }
        }
      },
      options());
}

TEST_P(ShmWorlds, LargeFloat32SumsFrom4KiBTo64MiBInPrivateAndAllocatedMemory) {
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        for (std::size_t bytes :
             {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
              (std::size_t{4} << 20) + 4, (std::size_t{16} << 20) + 12, std::size_t{64} << 20}) {
          const std::size_t count = bytes / 4;
          for (Memory memory : {Memory::kPrivate, Memory::kShared}) {
            std::vector<float> priv;
            std::shared_ptr<void> block;
            float* data;
            if (in_segment(memory, pg.rank())) {
              block = pg.allocate(bytes);
              data = static_cast<float*>(block.get());
            } else {
              priv.resize(count);
              data = priv.data();
            }
            for (std::size_t i = 0; i < count; ++i) data[i] = large_value(pg.rank(), i);
            pg.all_reduce(data, count, DType::kFloat32, ReduceOp::kSum);
            for (std::size_t i = 0; i < count; ++i) {
              float want = 0;
              for (int r = 0; r < n; ++r) want += large_value(r, i);
              if (data[i] != want) {
                ADD_FAILURE() << label(pg.rank(),
                                       std::string("float32 sum in ") + memory_name(memory), count)
                              << ": element " << i << " is " << data[i] << ", expected " << want;
                break;
              }
            }
          }
        }
      },
      options());
}

TEST_F(Shm, Float32SumOf256MiBWithTwoRanks) {
  constexpr std::size_t kCount = (std::size_t{256} << 20) / 4;
  on_ranks(
      2,
      [](ProcessGroup& pg) {
        std::vector<float> data(kCount);
        for (std::size_t i = 0; i < kCount; ++i) data[i] = large_value(pg.rank(), i);
        pg.all_reduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum);
        for (std::size_t i = 0; i < kCount; ++i) {
          const float want = large_value(0, i) + large_value(1, i);
          if (data[i] != want) {
            ADD_FAILURE() << "rank " << pg.rank() << ": element " << i << " of 256 MiB is "
                          << data[i] << ", expected " << want;
            break;
          }
        }
      },
      options());
}

// Inputs with fractions, so the order of additions changes the rounding: every
// rank must still end with the same bits (and close to the exact sum).
TEST_P(ShmVariants, FloatSumsAndAveragesAreBitIdenticalOnEveryRank) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const int n = world();
  const DType dtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  const std::size_t counts[] = {1001, 40000};  // single-copy, then several chunks
  auto value = [](int r, std::size_t i) {
    return std::sin(0.37 * static_cast<double>(i) + r) * (1.0 + 0.3 * r);
  };
  std::mutex mu;
  std::vector<std::vector<std::vector<unsigned char>>> results(n);  // [rank][case] bytes
  std::vector<std::string> cases;
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        std::vector<std::vector<unsigned char>> mine;
        std::vector<std::string> names;
        for (DType dtype : dtypes) {
          for (std::size_t count : counts) {
            // The exact sum of the inputs as stored in this dtype.
            std::vector<double> exact(count, 0.0);
            for (int r = 0; r < n; ++r) {
              Buffer stored(dtype, count);
              stored.fill(0, count, [&](std::size_t i) { return value(r, i); });
              for (std::size_t i = 0; i < count; ++i) exact[i] += stored.get(i);
            }
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
              for (Memory memory : kMemories) {
                Buffer buf(dtype, count);
                buf.fill(0, count, [&](std::size_t i) { return value(pg.rank(), i); });
                all_reduce_in(pg, buf, op, memory);
                double worst = 0;
                for (std::size_t i = 0; i < count; ++i) {
                  const double want = op == ReduceOp::kAvg ? exact[i] / n : exact[i];
                  worst = std::max(worst, std::abs(buf.get(i) - want));
                }
                const double allowed = dtype == DType::kFloat64   ? 1e-12
                                       : dtype == DType::kFloat32 ? 1e-5
                                       : dtype == DType::kFloat16 ? 0.05
                                                                  : 0.5;
                EXPECT_LE(worst, allowed)
                    << label(pg.rank(), std::string(dtype_name(dtype)) + " " + op_name(op), count);
                auto* p = static_cast<unsigned char*>(buf.data());
                mine.emplace_back(p, p + count * dtype_size(dtype));
                names.push_back(std::string(dtype_name(dtype)) + " " + op_name(op) + " of " +
                                std::to_string(count) + " in " + memory_name(memory));
              }
            }
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        results[pg.rank()] = std::move(mine);
        if (pg.rank() == 0) cases = std::move(names);
      },
      options());
  ASSERT_EQ(results[0].size(), cases.size());
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(results[r].size(), cases.size()) << "rank " << r;
    for (std::size_t c = 0; c < cases.size(); ++c) {
      EXPECT_TRUE(results[r][c] == results[0][c])
          << cases[c] << ": rank " << r << "'s bits differ from rank 0's";
    }
  }
}

// ---- The other shm collectives ----------------------------------------------------------

TEST_P(ShmVariants, BroadcastFromEveryRoot) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  on_ranks(
      world(), [](ProcessGroup& pg) { check_broadcast_from_every_root(pg, boundary_counts); },
      options());
}

// Broadcast with buffers from allocate() (pull: the others copy the root's
// buffer; push: the root writes theirs), on even ranks only (a variant that
// cannot run falls to the other or to the chunk slots), and private.
TEST_P(ShmVariants, BroadcastFromEveryRootInEveryMemoryMix) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  on_ranks(
      world(),
      [](ProcessGroup& pg) {
        const int n = pg.size(), me = pg.rank();
        for (Memory memory : kMemories) {
          for (int root = 0; root < n; ++root) {
            for (std::size_t count : kMixCounts) {
              Floats floats(pg, memory, count);
              float* buffer = floats.data;
              for (std::size_t i = 0; i < count; ++i)
                buffer[i] = me == root ? large_value(root, i) : -1.0f;
              pg.broadcast(buffer, count, DType::kFloat32, root);
              for (std::size_t i = 0; i < count; ++i) {
                if (buffer[i] != large_value(root, i)) {
                  FAIL() << memory_name(memory) << ", root " << root << ", count " << count
                         << ", rank " << me << ": element " << i << " is " << buffer[i]
                         << ", expected " << large_value(root, i);
                }
              }
            }
          }
        }
      },
      options());
}

TEST_P(ShmWorlds, ReduceLandsOnEveryRootAndLeavesOthersUnchanged) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        for (DType dtype : kDTypes) {
          for (ReduceOp op : kOps) {
            for (int root = 0; root < n; ++root) {
              for (std::size_t count :
                   {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
                check_reduce(pg, dtype, op, root, count);
              }
            }
          }
          // Several chunks plus a short remainder: two ops, first and last root.
          const std::size_t many = boundary_counts(dtype).back();
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
            for (int root : {0, n - 1}) check_reduce(pg, dtype, op, root, many);
          }
        }
      },
      options());
}

TEST_P(ShmVariants, AllGatherPutsEveryRanksInputInRankOrder) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  on_ranks(
      world(), [](ProcessGroup& pg) { check_all_gather(pg, boundary_counts); }, options());
}

// The zero-copy path (every output allocate()d: each rank writes its input
// into every output) and its mixes with the copying path, with the input
// apart or in place (the rank's own slice of its output, as ParamShards does).
TEST_P(ShmVariants, AllGatherInAllocatedOutputsInPlaceOrNotMatchesEveryMemoryMix) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  on_ranks(
      world(),
      [](ProcessGroup& pg) {
        const int n = pg.size(), me = pg.rank();
        for (Memory memory : kMemories) {
          for (bool in_place : {false, true}) {
            for (std::size_t count : kMixCounts) {
              Floats outputs(pg, memory, count * n);
              float* out = outputs.data;
              std::fill(out, out + count * n, -1.0f);
              std::vector<float> separate(count);
              float* in = in_place ? out + static_cast<std::size_t>(me) * count : separate.data();
              for (std::size_t i = 0; i < count; ++i) in[i] = large_value(me, i);
              pg.all_gather(in, out, count, DType::kFloat32);
              const std::string what = std::string(memory_name(memory)) +
                                       (in_place ? ", in place" : "") + ", count " +
                                       std::to_string(count) + ", rank " + std::to_string(me);
              for (int r = 0; r < n; ++r) {
                for (std::size_t i = 0; i < count; ++i) {
                  if (out[r * count + i] != large_value(r, i)) {
                    FAIL() << what << ": slice " << r << " element " << i << " is "
                           << out[r * count + i] << ", expected " << large_value(r, i);
                  }
                }
              }
            }
          }
        }
      },
      options());
}

// ---- all_reduce_partial -------------------------------------------------------------------

// Which rank needs element i (-1: none), in runs of 7 so ranges start and end
// inside cache lines and inside the ranks' slices.
int needer_of(std::size_t i, int world) {
  auto x = static_cast<std::uint32_t>(i / 7) * 2654435761u;
  return static_cast<int>((x >> 7) % static_cast<std::uint32_t>(world + 1)) - 1;
}

// The needed elements hold exactly the bits a full all_reduce gives (with
// float sums that round differently in another order), in every memory mix:
// in place (each rank reduces only its own elements) or the full paths.
TEST_P(ShmVariants, AllReducePartialGivesAllReducesBitsOnEveryNeededElement) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        const int me = pg.rank();
        for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32}) {
          const std::size_t e = dtype_size(dtype);
          for (std::size_t count : kMixCounts) {
            for (ReduceOp op : kOps) {
              for (Memory memory : kMemories) {
                Buffer values(dtype, count);
                // Inexact float sums: the order of the additions shows in the bits.
                values.fill(0, count, [&](std::size_t i) {
                  auto x =
                      static_cast<std::uint32_t>(i * 40503u + static_cast<std::size_t>(me) * 977u) *
                      2654435761u;
                  const double v = static_cast<double>((x >> 8) % 20001u) - 10000.0;
                  return dtype == DType::kInt32 ? v : v / 7.0;
                });
                Buffer full = values;
                all_reduce_in(pg, full, op, memory);
                std::vector<ElementRange> needed;
                for (std::size_t i = 0; i < count; ++i) {
                  if (needer_of(i, n) != me) continue;
                  if (!needed.empty() && needed.back().end == i) {
                    ++needed.back().end;
                  } else {
                    needed.push_back({i, i + 1});
                  }
                }
                std::shared_ptr<void> block;
                char* data = values.slice(0);
                if (in_segment(memory, me)) {
                  block = pg.allocate(count * e);
                  std::memcpy(block.get(), values.data(), count * e);
                  data = static_cast<char*>(block.get());
                }
                pg.all_reduce_partial(data, count, dtype, op, needed);
                for (const ElementRange& r : needed) {
                  for (std::size_t i = r.begin; i < r.end; ++i) {
                    if (std::memcmp(data + i * e, full.slice(i), e) != 0) {
                      Buffer got(dtype, 1);
                      std::memcpy(got.data(), data + i * e, e);
                      FAIL() << "rank " << me << ", " << dtype_name(dtype) << " " << op_name(op)
                             << " in " << memory_name(memory) << ", count " << count << ": element "
                             << i << " is " << got.get(0) << ", all_reduce gives " << full.get(i);
                    }
                  }
                }
              }
            }
          }
        }
        // A range past the buffer is refused before anything is sent, naming it.
        std::vector<float> few(8, 1.0f);
        const std::string error = error_of([&] {
          pg.all_reduce_partial(few.data(), 8, DType::kFloat32, ReduceOp::kSum, {{4, 9}});
        });
        EXPECT_TRUE(contains(error, "[4, 9)")) << error;
        EXPECT_TRUE(contains(error, "8 elements")) << error;
      },
      options());
}

// ---- reduce_scatter ------------------------------------------------------------------------

// Native in shared memory: in place when every input is allocate()d (each rank
// reads its block from the others' inputs), through the chunk slots otherwise
// (with 64 KiB chunks a slot carries fewer elements per destination than a
// chunk of all_reduce, so the largest count spans several chunks). Also with
// the output being the rank's own block of its input, as ZeRO-style callers do.
TEST_P(ShmVariants, ReduceScatterMatchesReferenceForEveryDtypeOpBoundaryCountAndMemory) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        const int me = pg.rank();
        for (DType dtype : kDTypes) {
          const std::size_t e = dtype_size(dtype);
          for (std::size_t count : boundary_counts(dtype)) {
            for (ReduceOp op : kOps) {
              for (Memory memory : kMemories) {
                for (bool in_place : {false, true}) {
                  Buffer in(dtype, count * n);
                  in.fill(0, count * n, [&](std::size_t k) { return input_value(me, k, dtype); });
                  std::shared_ptr<void> block;
                  char* input = in.slice(0);
                  if (in_segment(memory, me)) {
                    block = pg.allocate(std::max<std::size_t>(count * n * e, 1));
                    std::memcpy(block.get(), in.data(), count * n * e);
                    input = static_cast<char*>(block.get());
                  }
                  Buffer out(dtype, count);
                  char* output =
                      in_place ? input + static_cast<std::size_t>(me) * count * e : out.slice(0);
                  pg.reduce_scatter(input, output, count, dtype, op);
                  if (in_place) std::memcpy(out.data(), output, count * e);
                  expect_elements(
                      out, 0, count,
                      [&](std::size_t i) {
                        return reference(op, dtype, n, [&](int r) {
                          return input_value(r, me * count + i, dtype);
                        });
                      },
                      label(me,
                            std::string("reduce_scatter ") + op_name(op) + " in " +
                                memory_name(memory) + (in_place ? ", in place" : ""),
                            count));
                }
              }
            }
          }
        }
      },
      options());
}

TEST_P(ShmWorlds, BarrierHoldsEveryRankUntilTheLastArrives) {
  const int n = world();
  std::atomic<int> arrived{0}, passed{0};
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        for (int round = 1; round <= 5; ++round) {
          if (pg.rank() == n - 1) {
            // The others are (about to be) in the barrier: none may pass before this rank comes.
            while (arrived.load() < round * n - 1) std::this_thread::yield();
            std::this_thread::sleep_for(5ms);  // a chance for a broken barrier to let them through
            EXPECT_EQ(passed.load(), (round - 1) * n)
                << "a rank passed barrier " << round << " early";
          }
          arrived.fetch_add(1);
          pg.barrier();
          passed.fetch_add(1);
          pg.barrier();  // nobody starts the next round before everyone passed this one
        }
      },
      options());
  EXPECT_EQ(passed.load(), 5 * n);
}

TEST_P(ShmWorlds, AsyncCollectivesOnEveryPathCompleteInIssueOrder) {
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        const std::size_t small = 7,
                          large = 300001;  // single-copy; several 1 MiB chunks of float32
        Buffer a(DType::kInt32, small), b(DType::kFloat32, large), c(DType::kInt64, small * n),
            d(DType::kInt64, small);
        a.fill(0, small, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kInt32); });
        b.fill(0, large, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kFloat32); });
        d.fill(0, small, [&](std::size_t i) { return moved_value(pg.rank(), i, DType::kInt64); });
        auto block = pg.allocate(large * 4);
        auto* z = static_cast<float*>(block.get());
        for (std::size_t i = 0; i < large; ++i) z[i] = static_cast<float>(pg.rank() + 1);
        std::vector<std::shared_ptr<Work>> works;
        works.push_back(pg.all_reduce_async(a.data(), small, DType::kInt32, ReduceOp::kMax));
        works.push_back(pg.all_reduce_async(b.data(), large, DType::kFloat32, ReduceOp::kSum));
        works.push_back(pg.all_reduce_async(z, large, DType::kFloat32, ReduceOp::kSum));
        works.push_back(pg.all_gather_async(d.data(), c.data(), small, DType::kInt64));
        works.push_back(pg.barrier_async());
        works.push_back(pg.broadcast_async(a.data(), small, DType::kInt32, n - 1));
        for (auto it = works.rbegin(); it != works.rend(); ++it)
          EXPECT_TRUE((*it)->wait(20s)) << (*it)->description();
        expect_elements(
            a, 0, small,
            [&](std::size_t i) {
              return all_reduce_reference(ReduceOp::kMax, DType::kInt32, n, i);
            },
            "async all_reduce max");
        expect_elements(
            b, 0, large,
            [&](std::size_t i) {
              return all_reduce_reference(ReduceOp::kSum, DType::kFloat32, n, i);
            },
            "async all_reduce sum");
        for (std::size_t i = 0; i < large; ++i) {
          if (z[i] != static_cast<float>(n * (n + 1) / 2)) {
            ADD_FAILURE() << "async zero-copy all_reduce: element " << i << " is " << z[i];
            break;
          }
        }
        for (int r = 0; r < n; ++r) {
          expect_elements(
              c, r * small, small, [&](std::size_t i) { return moved_value(r, i, DType::kInt64); },
              "async all_gather");
        }
      },
      options());
}

// ---- The Gloo fallbacks, and the same bytes as a Gloo group -----------------------------

// Runs every collective on exact inputs, checks the ones shm hands to Gloo
// against the reference, and returns every output's bytes.
std::vector<unsigned char> run_every_collective(ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  std::vector<unsigned char> bytes;
  auto keep = [&](Buffer& b) {
    auto* p = static_cast<unsigned char*>(b.data());
    bytes.insert(bytes.end(), p, p + b.count() * dtype_size(b.dtype()));
  };
  for (DType dtype : kDTypes) {
    // Past the single-copy limit for two dtypes only (the Gloo ones do not care).
    std::vector<std::size_t> counts = {0, 7, 1001};
    if (dtype == DType::kFloat32 || dtype == DType::kInt64) counts.push_back(20000);
    for (std::size_t count : counts) {
      for (int root : {0, n - 1}) {
        Buffer in(dtype, count), out(dtype, count * n);
        in.fill(0, count, [&](std::size_t i) { return moved_value(me, i, dtype); });
        out.fill(0, count * n, [](std::size_t) { return 0.0; });
        pg.gather(in.data(), me == root ? out.data() : nullptr, count, dtype, root);
        if (me == root) {
          for (int r = 0; r < n; ++r) {
            expect_elements(
                out, r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
                label(me, "gather to root " + std::to_string(root) + ", slice " + std::to_string(r),
                      count));
          }
        }
        keep(out);

        Buffer all(dtype, count * n), mine(dtype, count);
        all.fill(0, count * n, [&](std::size_t k) { return moved_value(root, k, dtype); });
        mine.fill(0, count, [](std::size_t) { return 0.0; });
        pg.scatter(me == root ? all.data() : nullptr, mine.data(), count, dtype, root);
        expect_elements(
            mine, 0, count, [&](std::size_t i) { return moved_value(root, me * count + i, dtype); },
            label(me, "scatter from root " + std::to_string(root), count));
        keep(mine);

        Buffer b(dtype, count);
        b.fill(0, count, [&](std::size_t i) { return moved_value(me, i, dtype); });
        pg.broadcast(b.data(), count, dtype, root);
        keep(b);
      }
      Buffer in(dtype, count * n), out(dtype, count * n);
      in.fill(0, count * n, [&](std::size_t k) { return moved_value(me, k, dtype); });
      pg.all_to_all(in.data(), out.data(), count, dtype);
      for (int i = 0; i < n; ++i) {
        expect_elements(
            out, i * count, count,
            [&](std::size_t j) { return moved_value(i, me * count + j, dtype); },
            label(me, "all_to_all slice from rank " + std::to_string(i), count));
      }
      keep(out);

      Buffer gathered(dtype, count * n), one(dtype, count);
      one.fill(0, count, [&](std::size_t i) { return moved_value(me, i, dtype); });
      pg.all_gather(one.data(), gathered.data(), count, dtype);
      keep(gathered);

      for (ReduceOp op : kOps) {
        Buffer rin(dtype, count * n), rout(dtype, count);
        rin.fill(0, count * n, [&](std::size_t k) { return input_value(me, k, dtype); });
        pg.reduce_scatter(rin.data(), rout.data(), count, dtype, op);
        expect_elements(
            rout, 0, count,
            [&](std::size_t i) {
              return reference(op, dtype, n,
                               [&](int r) { return input_value(r, me * count + i, dtype); });
            },
            label(me, std::string("reduce_scatter ") + op_name(op), count));
        keep(rout);

        Buffer ar(dtype, count), red(dtype, count);
        ar.fill(0, count, [&](std::size_t i) { return input_value(me, i, dtype); });
        red.fill(0, count, [&](std::size_t i) { return input_value(me, i, dtype); });
        pg.all_reduce(ar.data(), count, dtype, op);
        pg.reduce(red.data(), count, dtype, op, n - 1);
        keep(ar);
        keep(red);
      }
    }
  }
  pg.barrier();
  return bytes;
}

TEST_P(ShmWorlds, EveryCollectiveGivesTheSameBytesAsGloo) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const int n = world();
  std::vector<std::vector<unsigned char>> gloo(n), shm(n);
  on_ranks(
      n, [&](ProcessGroup& pg) { gloo[pg.rank()] = run_every_collective(pg); },
      ::ddp::testing::gloo_options());
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.backend_name(), "shm");
        shm[pg.rank()] = run_every_collective(pg);
      },
      options());
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(shm[r].size(), gloo[r].size()) << "rank " << r;
    auto diff = std::mismatch(shm[r].begin(), shm[r].end(), gloo[r].begin());
    EXPECT_TRUE(diff.first == shm[r].end())
        << "rank " << r << ": shm and gloo outputs differ first at byte "
        << (diff.first - shm[r].begin()) << " of " << shm[r].size();
  }
}

// ---- Failures: mismatches and timeouts fail every rank, and the group stays failed ------

struct MismatchCase {
  std::string name;
  std::function<void(ProcessGroup&, float*)> call;  // what each rank calls (buffer of 20000 floats)
  std::vector<std::string> every_error_names;       // what every rank's error must say
};

TEST_P(ShmWorlds, MismatchFailsEveryRankAtOnceAndTheGroupRefusesMore) {
  const int n = world();
  const std::vector<MismatchCase> cases = {
      {"count, single-copy path",
       [](ProcessGroup& pg, float* p) {
         pg.all_reduce(p, pg.rank() == 1 ? 5 : 4, DType::kFloat32);
       },
       {"all_reduce of 20 bytes of float32 (sum)", "all_reduce of 16 bytes of float32 (sum)"}},
      {"count, copying path",
       [](ProcessGroup& pg, float* p) {
         pg.all_reduce(p, pg.rank() == 1 ? 20000 : 10000, DType::kFloat32);
       },
       {"all_reduce of 80000 bytes", "all_reduce of 40000 bytes"}},
      {"count, single-copy against copying path",
       [](ProcessGroup& pg, float* p) {
         pg.all_reduce(p, pg.rank() == 1 ? 10000 : 4000, DType::kFloat32);
       },
       {"all_reduce of 40000 bytes", "all_reduce of 16000 bytes"}},
      {"op",
       [](ProcessGroup& pg, float* p) {
         pg.all_reduce(p, 4, DType::kFloat32, pg.rank() == 1 ? ReduceOp::kMax : ReduceOp::kSum);
       },
       {"(max)", "(sum)"}},
      {"collective",
       [](ProcessGroup& pg, float* p) {
         if (pg.rank() == 1) {
           pg.broadcast(p, 4, DType::kFloat32, 0);
         } else {
           pg.all_reduce(p, 4, DType::kFloat32);
         }
       },
       {"broadcast of 16 bytes of float32 from root 0", "all_reduce of 16 bytes of float32 (sum)"}},
      {"root",
       [](ProcessGroup& pg, float* p) {
         pg.broadcast(p, 100000, DType::kFloat32, pg.rank() == 1 ? 1 : 0);
       },
       {"from root 1", "from root 0"}},
      {"reduce_scatter against all_reduce",
       [](ProcessGroup& pg, float* p) {
         if (pg.rank() == 1) {
           pg.reduce_scatter(p, p + 50000, 4, DType::kFloat32, ReduceOp::kSum);
         } else {
           pg.all_reduce(p, 4, DType::kFloat32);
         }
       },
       {"reduce_scatter of 16 bytes of float32 (sum)", "all_reduce of 16 bytes of float32 (sum)"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("mismatch of " + c.name);
    std::vector<std::string> errors(n), after(n);
    const auto start = std::chrono::steady_clock::now();
    on_ranks(
        n,
        [&](ProcessGroup& pg) {
          std::vector<float> data(100000, 1.0f);
          errors[pg.rank()] = error_of([&] { c.call(pg, data.data()); });
          // Ranks may now be out of step: every later collective is refused at once, on every path.
          std::string refused = error_of([&] { pg.all_reduce(data.data(), 4, DType::kFloat32); });
          refused += "\n" + error_of([&] { pg.all_reduce(data.data(), 100000, DType::kFloat32); });
          refused += "\n" + error_of([&] { pg.barrier(); });
          refused += "\n" + error_of([&] {
                       pg.all_gather(data.data(), data.data() + 50000, 4, DType::kFloat32);
                     });
          refused += "\n" + error_of([&] {
                       pg.gather(data.data(), data.data() + 50000, 4, DType::kFloat32, 0);
                     });
          after[pg.rank()] = refused;
        },
        options());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s)
        << "a mismatch must fail at once, not at the 30 s timeout";
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
      EXPECT_TRUE(contains(errors[r], "collective mismatch")) << errors[r];
      EXPECT_TRUE(contains(errors[r], "rank " + std::to_string(r) + ": ")) << errors[r];
      for (const auto& part : c.every_error_names)
        EXPECT_TRUE(contains(errors[r], part)) << "missing: " << part;
      // The rank that differs is named by every rank (by itself as "rank 1 is in").
      EXPECT_TRUE(contains(errors[r], "rank 1 ")) << errors[r];
      std::size_t refusals = 0;
      for (std::size_t at = 0;
           (at = after[r].find("unusable after an earlier failure", at)) != std::string::npos;
           ++at) {
        ++refusals;
      }
      EXPECT_EQ(refusals, 5u) << after[r];
    }
  }
}

// Ranks 1 and 3 of 4 never come (the single-missing case is the same wait).
TEST_F(Shm, TimeoutNamesTheRanksThatNeverArrived) {
  const int n = 4;
  const std::vector<int> absent = {1, 3};
  const std::string absent_list = "1, 3";
  auto is_absent = [&](int r) {
    return std::find(absent.begin(), absent.end(), r) != absent.end();
  };
  std::vector<std::string> errors(n);
  std::latch others_done(n - static_cast<int>(absent.size()));
  const auto start = std::chrono::steady_clock::now();
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        if (is_absent(pg.rank())) {
          others_done
              .wait();  // never calls the collective; keeps its group until the others gave up
          return;
        }
        // Large enough for the copying path (the single-copy path waits the same way).
        std::vector<float> data(20000, 1.0f);
        errors[pg.rank()] =
            error_of([&] { pg.all_reduce(data.data(), data.size(), DType::kFloat32); });
        others_done.count_down();
      },
      options(1s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int r = 0; r < n; ++r) {
    if (is_absent(r)) continue;
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + errors[r]);
    EXPECT_TRUE(
        contains(errors[r], "rank " + std::to_string(r) + ": all_reduce of 20000 float32 (sum)"));
    EXPECT_TRUE(contains(errors[r], "timed out waiting in shared memory for rank(s) " +
                                        absent_list + " (same node)"));
    EXPECT_TRUE(contains(errors[r], "ranks that had not arrived: " + absent_list));
  }
}

// ---- allocate() ---------------------------------------------------------------------------

TEST_P(ShmWorlds, AllocateGivesAlignedWritableDisjointBlocksThatCanBeFreedAndReused) {
  const int n = world();
  on_ranks(
      n,
      [n](ProcessGroup& pg) {
        const std::vector<std::size_t> sizes = {0,    1,    63,   64,     100,
                                                4095, 4096, 4097, 100000, std::size_t{3} << 20};
        std::vector<std::shared_ptr<void>> blocks;
        auto fill = [&](std::size_t k) {
          std::memset(blocks[k].get(), static_cast<int>(k * 17 + pg.rank() + 1),
                      std::max<std::size_t>(sizes[k], 1));
        };
        auto intact = [&](std::size_t k) {
          auto* p = static_cast<const unsigned char*>(blocks[k].get());
          const auto want = static_cast<unsigned char>(k * 17 + pg.rank() + 1);
          for (std::size_t i = 0; i < std::max<std::size_t>(sizes[k], 1); ++i) {
            if (p[i] != want) return false;
          }
          return true;
        };
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          blocks.push_back(pg.allocate(sizes[k]));
          ASSERT_NE(blocks[k], nullptr) << "allocate(" << sizes[k] << ")";
          EXPECT_EQ(reinterpret_cast<std::uintptr_t>(blocks[k].get()) % 64, 0u)
              << "allocate(" << sizes[k] << ")";
          fill(k);
        }
        // No two blocks overlap (a block of 0 bytes still counts as one byte).
        for (std::size_t a = 0; a < sizes.size(); ++a) {
          for (std::size_t b = a + 1; b < sizes.size(); ++b) {
            auto pa = reinterpret_cast<std::uintptr_t>(blocks[a].get()),
                 pb = reinterpret_cast<std::uintptr_t>(blocks[b].get());
            EXPECT_TRUE(pa + std::max<std::size_t>(sizes[a], 1) <= pb ||
                        pb + std::max<std::size_t>(sizes[b], 1) <= pa)
                << "blocks of " << sizes[a] << " and " << sizes[b] << " bytes overlap";
          }
        }
        for (std::size_t k = 0; k < sizes.size(); ++k)
          EXPECT_TRUE(intact(k)) << "block of " << sizes[k] << " bytes";
        // Free every other block, reallocate them (other sizes too), and all stay intact.
        for (std::size_t k = 0; k < sizes.size(); k += 2) blocks[k].reset();
        for (std::size_t k = 0; k < sizes.size(); k += 2) {
          blocks[k] = pg.allocate(sizes[k]);
          ASSERT_NE(blocks[k], nullptr);
          fill(k);
        }
        for (std::size_t k = 0; k < sizes.size(); ++k)
          EXPECT_TRUE(intact(k)) << "block of " << sizes[k] << " bytes";
        // The freed and reused memory still works for zero-copy all_reduce.
        const std::size_t count = (std::size_t{3} << 20) / 4;
        auto* f = static_cast<float*>(blocks.back().get());
        for (std::size_t i = 0; i < count; ++i) f[i] = large_value(pg.rank(), i);
        pg.all_reduce(f, count, DType::kFloat32, ReduceOp::kSum);
        for (std::size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += large_value(r, i);
          if (f[i] != want) {
            ADD_FAILURE() << "rank " << pg.rank() << ": zero-copy all_reduce element " << i
                          << " is " << f[i];
            break;
          }
        }
        for (std::size_t k = 0; k + 1 < sizes.size(); ++k)
          EXPECT_TRUE(intact(k)) << "block of " << sizes[k] << " bytes";
      },
      options());
}

TEST_F(Shm, AllocatedBlockOutlivesItsGroup) {
  const int n = 3;
  const std::size_t count = 200000;  // zero-copy path
  std::vector<std::shared_ptr<void>> kept(n);
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        auto block = pg.allocate(count * 4);
        auto* f = static_cast<float*>(block.get());
        for (std::size_t i = 0; i < count; ++i) f[i] = static_cast<float>(pg.rank() + 1);
        pg.all_reduce(f, count, DType::kFloat32, ReduceOp::kSum);
        kept[pg.rank()] = std::move(block);
      },
      options());
  // Every group is destroyed: the blocks still hold the results and take writes.
  for (int r = 0; r < n; ++r) {
    auto* f = static_cast<float*>(kept[r].get());
    EXPECT_EQ(f[0], 6.0f) << "rank " << r;
    EXPECT_EQ(f[count - 1], 6.0f) << "rank " << r;
    std::memset(f, 0x5a, count * 4);
    EXPECT_EQ(static_cast<unsigned char*>(kept[r].get())[count * 4 - 1], 0x5a);
  }
  kept.clear();  // unmaps; TearDown checks nothing of the run is left
}

TEST_F(Shm, FullArenaFallsBackToPrivateMemoryAndFreedBlocksAreReused) {
  ScopedEnv arena("DDP_SHM_ARENA_MB", "4");
  const int n = 2;
  const std::size_t bytes = std::size_t{3} << 20, count = bytes / 4;
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        auto first = pg.allocate(bytes);
        void* at = first.get();
        first.reset();
        auto again = pg.allocate(bytes);  // the arena's only 3 MiB: the same block
        EXPECT_EQ(again.get(), at) << "a freed block was not reused";
        auto spill = pg.allocate(bytes);  // no room left: private memory, still usable
        ASSERT_NE(spill, nullptr);
        auto* lo = static_cast<char*>(at);
        auto* s = static_cast<char*>(spill.get());
        EXPECT_TRUE(s + bytes <= lo || s >= lo + (std::size_t{4} << 20))
            << "the spilled block overlaps the arena";
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s) % 64, 0u);
        // Zero-copy on the arena blocks, then the copying path on the private ones.
        for (void* p : {again.get(), spill.get()}) {
          auto* f = static_cast<float*>(p);
          for (std::size_t i = 0; i < count; ++i) f[i] = large_value(pg.rank(), i);
          pg.all_reduce(f, count, DType::kFloat32, ReduceOp::kSum);
          for (std::size_t i = 0; i < count; ++i) {
            if (f[i] != large_value(0, i) + large_value(1, i)) {
              ADD_FAILURE() << "rank " << pg.rank() << ": element " << i << " is " << f[i];
              break;
            }
          }
        }
      },
      options());
}

TEST_F(Shm, SegmentNameIsRemovedOnceEveryRankAttached) {
  ASSERT_EQ(shm_run_prefix(run_id_), "ddp-" + run_id_ + "-");
  const int n = 3;
  std::vector<std::vector<std::string>> seen(n);
  on_ranks(
      n,
      [&](ProcessGroup& pg) {
        pg.barrier();  // every rank's group is complete, local rank 0's included
        seen[pg.rank()] = shm_segments_of(run_id_);
        std::int32_t one = 1;
        pg.all_reduce(&one, 1, DType::kInt32);  // the unlinked segment still works
        EXPECT_EQ(one, n);
      },
      options());
  for (int r = 0; r < n; ++r) EXPECT_EQ(seen[r], std::vector<std::string>{}) << "rank " << r;
}

// ---- Ranks on several (simulated) nodes: hierarchical all-reduce, Gloo fallback ----------

// Runs body on ranks placed on nodes of the given sizes (ranks of a node
// consecutive), each a thread with its own shm group over one in-memory store.
void on_nodes(const std::vector<int>& node_sizes, const std::function<void(ProcessGroup&)>& body,
              const ProcessGroupOptions& base) {
  static std::shared_ptr<Store> shared = make_memory_store();
  static std::atomic<int> runs{0};
  auto store = make_prefix_store(shared, "nodes" + std::to_string(runs++));
  int world = 0;
  for (int s : node_sizes) world += s;
  std::latch finished(world);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int node = 0, rank = 0; node < static_cast<int>(node_sizes.size()); ++node) {
    for (int local = 0; local < node_sizes[node]; ++local, ++rank) {
      ProcessGroupOptions options = base;
      options.local_rank = local;
      options.local_size = node_sizes[node];
      options.node = node;
      options.nodes = static_cast<int>(node_sizes.size());
      threads.emplace_back([&, rank, options] {
        std::shared_ptr<ProcessGroup> group;
        try {
          group = ProcessGroup::create(rank, world, store, options);
          body(*group);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back("rank " + std::to_string(rank) + " threw: " + e.what());
        }
        finished.arrive_and_wait();
        group.reset();
      });
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// all_reduce of every dtype and op on every path, then the collectives shm
// runs only on one node (Gloo here), with float sums identical on every rank.
// `every_op`: all five ops, else sum and avg (kAvg is the one the hierarchy
// treats apart). Private and allocate()d buffers (mixed ones take the private path).
void check_across_nodes(ProcessGroup& pg, std::vector<unsigned char>& float_bits, bool every_op) {
  const int n = pg.size(), me = pg.rank();
  const std::vector<ReduceOp> ops = every_op
                                        ? std::vector<ReduceOp>(std::begin(kOps), std::end(kOps))
                                        : std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kAvg};
  for (DType dtype : kDTypes) {
    const std::size_t e = dtype_size(dtype);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001},
                              kSmallBytes / e + 1, 2 * ((kChunkKiB << 10) / e) + 13}) {
      for (ReduceOp op : ops) {
        for (Memory memory : {Memory::kPrivate, Memory::kShared}) {
          Buffer buf(dtype, count);
          buf.fill(0, count, [&](std::size_t i) { return input_value(me, i, dtype); });
          all_reduce_in(pg, buf, op, memory);
          expect_elements(
              buf, 0, count, [&](std::size_t i) { return all_reduce_reference(op, dtype, n, i); },
              label(me, std::string("all_reduce ") + op_name(op) + " in " + memory_name(memory),
                    count));
        }
      }
    }
  }
  for (Memory memory : kMemories) {
    Buffer buf(DType::kFloat32, 50000);
    buf.fill(0, 50000, [&](std::size_t i) {
      return std::sin(0.37 * static_cast<double>(i) + me) * (1 + 0.3 * me);
    });
    all_reduce_in(pg, buf, ReduceOp::kSum, memory);
    auto* p = static_cast<unsigned char*>(buf.data());
    float_bits.insert(float_bits.end(), p, p + 50000 * 4);
  }
  for (int root = 0; root < n; ++root) {
    Buffer b(DType::kInt64, 1001);
    b.fill(0, 1001, [&](std::size_t i) { return moved_value(me, i, DType::kInt64); });
    pg.broadcast(b.data(), 1001, DType::kInt64, root);
    expect_elements(
        b, 0, 1001, [&](std::size_t i) { return moved_value(root, i, DType::kInt64); },
        label(me, "broadcast from root " + std::to_string(root), 1001));
    Buffer r(DType::kFloat32, 1001);
    r.fill(0, 1001, [&](std::size_t i) { return input_value(me, i, DType::kFloat32); });
    pg.reduce(r.data(), 1001, DType::kFloat32, ReduceOp::kMax, root);
    expect_elements(
        r, 0, 1001,
        [&](std::size_t i) {
          return me == root ? all_reduce_reference(ReduceOp::kMax, DType::kFloat32, n, i)
                            : input_value(me, i, DType::kFloat32);
        },
        label(me, "reduce max to root " + std::to_string(root), 1001));
  }
  Buffer in(DType::kBFloat16, 777), out(DType::kBFloat16, 777 * n);
  in.fill(0, 777, [&](std::size_t i) { return moved_value(me, i, DType::kBFloat16); });
  pg.all_gather(in.data(), out.data(), 777, DType::kBFloat16);
  for (int r = 0; r < n; ++r) {
    expect_elements(
        out, r * 777, 777, [&](std::size_t i) { return moved_value(r, i, DType::kBFloat16); },
        label(me, "all_gather slice " + std::to_string(r), 777));
  }
  pg.barrier();
}

// Ranks per node, and whether every op is checked (else sum and avg: the
// slices and the routing are the same for every op).
struct Layout {
  std::vector<int> sizes;
  bool every_op;
};
// What ctest's "# GetParam() = ..." shows, instead of the struct's bytes.
void PrintTo(const Layout& layout, std::ostream* os) {
  *os << "ranks per node:";
  for (int s : layout.sizes) *os << " " << s;
  if (layout.every_op) *os << ", every collective";
}

class ShmNodes : public Shm, public ::testing::WithParamInterface<Layout> {};

TEST_P(ShmNodes, EveryCollectiveAgreesWithTheReferenceAndFloatSumsMatchBitForBit) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const Layout layout = GetParam();
  int n = 0;
  for (int s : layout.sizes) n += s;
  std::vector<std::vector<unsigned char>> bits(n);
  on_nodes(
      layout.sizes,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.backend_name(), "shm");
        check_across_nodes(pg, bits[pg.rank()], layout.every_op);
      },
      options());
  for (int r = 1; r < n; ++r)
    EXPECT_TRUE(bits[r] == bits[0]) << "rank " << r << "'s float sums differ from rank 0's";
}

// Same sizes on every node: hierarchical (shm, then Gloo among equal local
// ranks); one rank per node (Gloo among the nodes); nodes of different sizes
// (Gloo over all ranks).
INSTANTIATE_TEST_SUITE_P(Layouts, ShmNodes,
                         ::testing::Values(Layout{{2, 2}, true}, Layout{{3, 3}, false},
                                           Layout{{1, 1, 1}, false}, Layout{{2, 1}, false},
                                           Layout{{1, 3}, false}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           std::string name = "nodes";
                           for (int s : info.param.sizes) name += "_" + std::to_string(s);
                           return name;
                         });

INSTANTIATE_TEST_SUITE_P(Algorithms, ShmVariants,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values("auto", "push", "pull", "chunked",
                                                              "small")),
                         [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

INSTANTIATE_TEST_SUITE_P(Worlds, ShmWorlds, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

// ---- ArenaAllocator: the bookkeeping behind allocate() ------------------------------------

using shm::ArenaAllocator;

TEST(ArenaAllocator, OffsetsAreAlignedAndSizesRoundUp) {
  ArenaAllocator page(1 << 20);
  EXPECT_EQ(page.take(1), 0u);
  EXPECT_EQ(page.take(1), 4096u);
  EXPECT_EQ(page.take(5000), 8192u);  // two pages
  EXPECT_EQ(page.take(0), 16384u);    // 0 counts as 1
  EXPECT_EQ(page.take(4096), 20480u);
  EXPECT_EQ(page.free_bytes(), (1u << 20) - 24576u);

  ArenaAllocator lines(1000, 64);  // capacity rounds down to 960
  EXPECT_EQ(lines.free_bytes(), 960u);
  EXPECT_EQ(lines.take(1), 0u);
  EXPECT_EQ(lines.take(65), 64u);
  EXPECT_EQ(lines.take(64), 192u);
  for (std::size_t k = 0; k < 8; ++k) {
    auto at = lines.take(10);
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(*at % 64, 0u);
  }
  EXPECT_EQ(lines.free_bytes(), 960u - 12 * 64);
}

TEST(ArenaAllocator, TakesTheFirstBlockThatFitsNotTheBestOne) {
  ArenaAllocator a(16 * 4096);
  auto p0 = a.take(2 * 4096), p1 = a.take(4096), p2 = a.take(4096), p3 = a.take(4096);
  ASSERT_TRUE(p0 && p1 && p2 && p3);
  a.give_back(*p0);             // a hole of 2 pages at 0
  a.give_back(*p2);             // a hole of 1 page at 3 pages
  EXPECT_EQ(a.take(4096), 0u);  // first fit: the 2-page hole, not the exact 1-page one
  EXPECT_EQ(a.take(4096), 4096u);
  EXPECT_EQ(a.take(4096), 3u * 4096);
  EXPECT_EQ(a.take(2 * 4096), 5u * 4096);  // past the last used block
}

TEST(ArenaAllocator, FreedNeighboursMergeInAnyOrder) {
  // Each order of giving back three adjacent blocks ends in one block of everything.
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 1, 0}, {0, 2, 1},
                                                {1, 0, 2}, {1, 2, 0}, {2, 0, 1}};
  for (const auto& order : orders) {
    SCOPED_TRACE(::testing::PrintToString(order));
    ArenaAllocator a(3 * 8192);
    std::vector<std::size_t> at;
    for (int k = 0; k < 3; ++k) {
      auto p = a.take(8192);
      ASSERT_TRUE(p.has_value());
      at.push_back(*p);
    }
    EXPECT_EQ(a.take(1), std::nullopt);
    for (int k : order) a.give_back(at[k]);
    EXPECT_EQ(a.free_bytes(), 3u * 8192);
    EXPECT_EQ(a.take(3 * 8192), 0u) << "the freed blocks did not merge into one";
  }
}

TEST(ArenaAllocator, ExhaustionReturnsNothing) {
  ArenaAllocator a(4 * 4096);
  EXPECT_EQ(a.take(5 * 4096), std::nullopt);
  EXPECT_EQ(a.take(std::numeric_limits<std::size_t>::max()),
            std::nullopt);  // rounding up would overflow
  EXPECT_EQ(a.take(std::numeric_limits<std::size_t>::max() - 100), std::nullopt);
  auto all = a.take(4 * 4096);
  EXPECT_EQ(all, 0u);
  EXPECT_EQ(a.take(1), std::nullopt);
  EXPECT_EQ(a.free_bytes(), 0u);
  a.give_back(*all);
  EXPECT_EQ(a.take(4 * 4096), 0u);

  ArenaAllocator none(100);  // less than one page: no room at all
  EXPECT_EQ(none.free_bytes(), 0u);
  EXPECT_EQ(none.take(1), std::nullopt);
}

TEST(ArenaAllocator, GivingBackWhatWasNotTakenThrows) {
  ArenaAllocator a(8 * 4096);
  auto p = a.take(2 * 4096);
  ASSERT_EQ(p, 0u);
  EXPECT_THROW(a.give_back(4096), Error);      // inside a block, not its start
  EXPECT_THROW(a.give_back(2 * 4096), Error);  // free space
  EXPECT_THROW(a.give_back(1 << 30), Error);   // outside the arena
  EXPECT_NE(error_of([&] { a.give_back(12345); }).find("12345"), std::string::npos);
  a.give_back(*p);
  EXPECT_THROW(a.give_back(*p), Error);  // twice
  EXPECT_EQ(a.free_bytes(), 8u * 4096);
}

}  // namespace
}  // namespace ddp
