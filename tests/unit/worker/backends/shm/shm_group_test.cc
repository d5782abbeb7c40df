// libddp's shm group beyond its own collectives, ranks as threads: the collectives
// it hands to Gloo give the same bytes as a Gloo group, a mismatch or a timeout
// fails every rank at once and names who never came, allocate()'s blocks (aligned,
// disjoint, outliving the group, private memory once the arena is full), and the
// segment's name removed once every rank attached.

#include "shm_test_fixtures.h"

namespace ddp {
namespace {

using namespace ::ddp::shm_test;
using namespace std::chrono_literals;

// The world sizes of this file's tests (a suite of its own, instantiated below).
class ShmGroupWorlds : public ShmWorlds {};

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

TEST_P(ShmGroupWorlds, EveryCollectiveGivesTheSameBytesAsGloo) {
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

TEST_P(ShmGroupWorlds, MismatchFailsEveryRankAtOnceAndTheGroupRefusesMore) {
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

TEST_P(ShmGroupWorlds, AllocateGivesAlignedWritableDisjointBlocksThatCanBeFreedAndReused) {
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

INSTANTIATE_TEST_SUITE_P(Worlds, ShmGroupWorlds, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace ddp
