// libddp's shm collectives with every rank a thread: every path of all_reduce
// (small single-copy, chunked private, zero-copy in allocate()d memory, and the
// mixes), every dtype and op and algorithm variant, bit-identical float results,
// broadcast, reduce, all_gather, all_reduce_partial, reduce_scatter, barrier and
// async order; every result checked element by element against values computed here.

#include "shm_test_fixtures.h"

namespace ddp {
namespace {

using namespace ::ddp::shm_test;
using namespace std::chrono_literals;

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

}  // namespace
}  // namespace ddp
