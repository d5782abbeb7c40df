// A worker for libddp's collective integration tests, run under ddprun (or
// alone, as a world of one). It calls ddp::init() and checks every collective
// for every dtype and op against values computed here from the ranks' known
// inputs. See usage() for the modes. A failed check prints
// "COLLECTIVES FAILED rank=R: <check>: <detail>" to stderr and exits 1.
// Over 600 lines because each mode is one scenario of the collective tests,
// and they share the checks and reference values here.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "typed_buffer.h"

namespace {

using namespace std::chrono_literals;
using ddp::DType;
using ddp::ReduceOp;

int usage() {
  std::fprintf(
      stderr,
      "usage: collective_worker MODE ...\n"
      "  all                every collective, dtype, op, root and count; prints COLLECTIVES OK "
      "rank=R\n"
      "  single             like all, and checks it is a world of one (run without ddprun)\n"
      "  timeout sleep DIR  rank 1 never calls all_reduce: it waits until the others wrote\n"
      "                     DIR/done_<rank>; the others print EXPECTED ERROR rank=R: <error>\n"
      "  timeout exit       rank 1 leaves right after init; the others as above\n"
      "  mismatch [RANK]    (DDP_DEBUG=1) RANK (default 1) all_reduces 5 elements, the others 4:\n"
      "                     every rank prints EXPECTED ERROR rank=R: <error>, then MISMATCH OK "
      "rank=R\n"
      "  large [MIB]        all_reduces of 4 KiB .. MIB (default 64) MiB (float32 sum, int32 max) "
      "in private\n"
      "                     and allocate()d buffers; float sums must match bit for bit on every\n"
      "                     rank; prints LARGE OK rank=R world=W backend=B\n"
      "  kill               every rank ignores SIGTERM and all_reduces 16 MiB in a loop; rank 1\n"
      "                     SIGKILLs itself after 3 of them; the others print EXPECTED ERROR\n"
      "                     rank=R: <error> and FAILED AFTER ms=<time in the failing call>, exit "
      "0\n"
      "  stop               all_reduces in a loop; rank 1 stops itself (SIGSTOP) after 3 of them\n"
      "  soak SECONDS       checked all_reduces and barriers for SECONDS; prints SOAK OK rank=R "
      "iterations=N\n"
      "  groups             ddp::new_group(\"second\", shm variants chunked) beside the default "
      "group: 1 MiB\n"
      "                     all_reduces on both; prints GROUPS rank=R default=<choice> "
      "second=<choice>,\n"
      "                     then REFUSED rank=R <new_group(\"default\")'s error>\n");
  return 64;
}

// A failed check: names what was checked.
struct CheckFailed {
  std::string what;
};

[[noreturn]] void fail(const std::string& what) { throw CheckFailed{what}; }

using ddp::testing::input_value;
using ddp::testing::is_float;
using ddp::testing::kCounts;
using ddp::testing::kDTypes;
using ddp::testing::kOps;
using ddp::testing::moved_value;
using ddp::testing::reference;

// The shared typed buffer, failing the run (CheckFailed) on a mismatch.
class Buffer : public ddp::testing::Buffer {
 public:
  using ddp::testing::Buffer::Buffer;
  void fill(std::size_t n, const std::function<double(std::size_t)>& f) {
    ddp::testing::Buffer::fill(0, n, f);
  }
  // Elements [first, first + n) must equal expected(j), j counting from 0.
  void expect(std::size_t first, std::size_t n, const std::function<double(std::size_t)>& expected,
              const std::string& what) const {
    std::string message = mismatch(first, n, expected, what);
    if (!message.empty()) fail(message);
  }
};

std::string of(std::size_t count) { return " of " + std::to_string(count); }

void check_all_reduce(ddp::ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : kCounts) {
        Buffer buf(dtype, count);
        buf.fill(count, [&](std::size_t i) { return input_value(me, i, dtype); });
        pg.all_reduce(buf.data(), count, dtype, op);
        buf.expect(
            0, count,
            [&](std::size_t i) {
              return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
            },
            std::string("all_reduce ") + ddp::op_name(op) + of(count));
      }
    }
  }
}

void check_broadcast(ddp::ProcessGroup& pg) {
  for (DType dtype : kDTypes) {
    for (int root = 0; root < pg.size(); ++root) {
      for (std::size_t count : kCounts) {
        Buffer buf(dtype, count);
        buf.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
        pg.broadcast(buf.data(), count, dtype, root);
        buf.expect(
            0, count, [&](std::size_t i) { return moved_value(root, i, dtype); },
            "broadcast from root " + std::to_string(root) + of(count));
      }
    }
  }
}

void check_reduce(ddp::ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (int root = 0; root < n; ++root) {
        const std::size_t count = 7;
        Buffer buf(dtype, count);
        buf.fill(count, [&](std::size_t i) { return input_value(me, i, dtype); });
        pg.reduce(buf.data(), count, dtype, op, root);
        auto what = std::string("reduce ") + ddp::op_name(op) + " to root " + std::to_string(root) +
                    of(count);
        if (me == root) {
          buf.expect(
              0, count,
              [&](std::size_t i) {
                return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
              },
              what);
        } else {
          buf.expect(
              0, count, [&](std::size_t i) { return input_value(me, i, dtype); },
              what + " (non-root data must be unchanged)");
        }
      }
    }
  }
}

void check_all_gather(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (std::size_t count : kCounts) {
      Buffer in(dtype, count), out(dtype, count * n);
      in.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
      pg.all_gather(in.data(), out.data(), count, dtype);
      for (int r = 0; r < n; ++r) {
        out.expect(
            r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
            "all_gather slice " + std::to_string(r) + of(count));
      }
    }
  }
}

void check_gather(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count), out(dtype, count * n);
        in.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
        pg.gather(in.data(), pg.rank() == root ? out.data() : nullptr, count, dtype, root);
        if (pg.rank() != root) continue;
        for (int r = 0; r < n; ++r) {
          out.expect(
              r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
              "gather to root " + std::to_string(root) + ", slice " + std::to_string(r) +
                  of(count));
        }
      }
    }
  }
}

void check_scatter(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count * n), out(dtype, count);
        in.fill(count * n, [&](std::size_t k) { return moved_value(root, k, dtype); });
        pg.scatter(pg.rank() == root ? in.data() : nullptr, out.data(), count, dtype, root);
        const std::size_t first = pg.rank() * count;
        out.expect(
            0, count, [&](std::size_t i) { return moved_value(root, first + i, dtype); },
            "scatter from root " + std::to_string(root) + of(count));
      }
    }
  }
}

void check_all_to_all(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (std::size_t count : kCounts) {
      Buffer in(dtype, count * n), out(dtype, count * n);
      in.fill(count * n, [&](std::size_t k) { return moved_value(pg.rank(), k, dtype); });
      pg.all_to_all(in.data(), out.data(), count, dtype);
      for (int i = 0; i < n; ++i) {
        out.expect(
            i * count, count,
            [&](std::size_t j) { return moved_value(i, pg.rank() * count + j, dtype); },
            "all_to_all slice from rank " + std::to_string(i) + of(count));
      }
    }
  }
}

void check_reduce_scatter(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count * n), out(dtype, count);
        in.fill(count * n, [&](std::size_t k) { return input_value(pg.rank(), k, dtype); });
        pg.reduce_scatter(in.data(), out.data(), count, dtype, op);
        const std::size_t first = pg.rank() * count;
        out.expect(
            0, count,
            [&](std::size_t i) {
              return reference(op, dtype, n,
                               [&](int r) { return input_value(r, first + i, dtype); });
            },
            std::string("reduce_scatter ") + ddp::op_name(op) + of(count));
      }
    }
  }
}

void check_objects(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (int root = 0; root < n; ++root) {
    for (std::size_t length :
         {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{5000}}) {
      std::string expected(length, '\0');
      for (std::size_t i = 0; i < length; ++i)
        expected[i] = static_cast<char>((i * 31 + root) % 256);
      std::string bytes = pg.rank() == root ? expected : std::string(pg.rank() + 5, 'x');
      pg.broadcast_object(bytes, root);
      if (bytes != expected) {
        fail("broadcast_object of " + std::to_string(length) + " bytes from root " +
             std::to_string(root) + ": got " + std::to_string(bytes.size()) + " bytes that differ");
      }
    }
  }
  auto object_of = [](int r) {
    std::string s(static_cast<std::size_t>(r) * 3, '\0');  // rank 0: empty
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(r * 40 + i);
    return s;
  };
  auto all = pg.all_gather_object(object_of(pg.rank()));
  if (static_cast<int>(all.size()) != n)
    fail("all_gather_object returned " + std::to_string(all.size()) + " objects");
  for (int r = 0; r < n; ++r) {
    if (all[r] != object_of(r))
      fail("all_gather_object: object of rank " + std::to_string(r) + " differs");
  }
  if (pg.all_gather_object("") != std::vector<std::string>(n))
    fail("all_gather_object of empty objects");
}

void check_barrier_and_async(ddp::ProcessGroup& pg) {
  pg.barrier();
  const int n = pg.size();
  const std::size_t count = 7;
  Buffer a(DType::kFloat32, count), b(DType::kInt64, count), gathered(DType::kInt32, count * n),
      mine(DType::kInt32, count);
  a.fill(count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kFloat32); });
  b.fill(count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kInt64); });
  mine.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, DType::kInt32); });
  std::vector<std::shared_ptr<ddp::Work>> works;
  works.push_back(pg.all_reduce_async(a.data(), count, DType::kFloat32, ReduceOp::kSum));
  works.push_back(pg.all_reduce_async(b.data(), count, DType::kInt64, ReduceOp::kMin));
  works.push_back(pg.all_gather_async(mine.data(), gathered.data(), count, DType::kInt32));
  works.push_back(pg.barrier_async());
  for (auto it = works.rbegin(); it != works.rend(); ++it) {
    if (!(*it)->wait(60s)) fail("async " + (*it)->description() + " did not finish within 60 s");
  }
  for (auto& w : works) {
    if (!w->is_completed())
      fail("async " + w->description() + ": is_completed() is false after wait()");
  }
  auto ref = [&](ReduceOp op, DType dtype, std::size_t i) {
    return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
  };
  a.expect(
      0, count, [&](std::size_t i) { return ref(ReduceOp::kSum, DType::kFloat32, i); },
      "async all_reduce sum");
  b.expect(
      0, count, [&](std::size_t i) { return ref(ReduceOp::kMin, DType::kInt64, i); },
      "async all_reduce min");
  for (int r = 0; r < n; ++r) {
    gathered.expect(
        r * count, count, [&](std::size_t i) { return moved_value(r, i, DType::kInt32); },
        "async all_gather slice " + std::to_string(r));
  }
}

int run_all(bool single) {
  auto group = ddp::init();
  ddp::ProcessGroup& pg = *group;
  const int rank = pg.rank();
  try {
    if (pg.rank() != ddp::rank() || pg.size() != ddp::world_size()) {
      fail("group is rank " + std::to_string(pg.rank()) + " of " + std::to_string(pg.size()) +
           ", the environment says " + std::to_string(ddp::rank()) + " of " +
           std::to_string(ddp::world_size()));
    }
    if (ddp::init() != group || &ddp::default_group() != group.get() || !ddp::is_initialized()) {
      fail("a second ddp::init() or default_group() did not return the group made by the first");
    }
    if (single && (pg.size() != 1 || ddp::is_distributed() || pg.backend_name() != "local")) {
      fail("single: expected a local world of one, got " + std::to_string(pg.size()) +
           " rank(s) on '" + pg.backend_name() + "'");
    }
    check_all_reduce(pg);
    check_broadcast(pg);
    check_reduce(pg);
    check_all_gather(pg);
    check_gather(pg);
    check_scatter(pg);
    check_all_to_all(pg);
    check_reduce_scatter(pg);
    check_objects(pg);
    check_barrier_and_async(pg);
  } catch (const CheckFailed& f) {
    // stderr: ddprun's failure report quotes the failed rank's last stderr lines.
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: %s\n", rank, f.what.c_str());
    return 1;
  }
  const std::string backend = pg.backend_name();
  const int world = pg.size();
  group.reset();
  ddp::shutdown();
  if (ddp::is_initialized()) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: is_initialized() after shutdown()\n", rank);
    return 1;
  }
  std::printf("COLLECTIVES OK rank=%d world=%d backend=%s\n", rank, world, backend.c_str());
  return 0;
}

void touch(const std::string& path) { std::ofstream(path) << "done\n"; }

// The others' all_reduce must fail with an error; rank 1 never takes part.
int run_timeout(const std::string& how, const std::string& dir) {
  auto group = ddp::init();
  const int rank = group->rank(), n = group->size();
  if (n < 2) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: timeout mode needs at least 2 ranks\n", rank);
    return 1;
  }
  if (rank == 1) {
    if (how == "exit") {
      std::printf("rank 1 leaving without all_reduce\n");
      std::fflush(stdout);
      std::_Exit(0);  // as a crashed-but-successful peer would: no goodbye
    }
    // Sleep until every other rank reported (bounded), never calling all_reduce.
    auto deadline = std::chrono::steady_clock::now() + 60s;
    for (int r = 0; r < n; ++r) {
      if (r == 1) continue;
      while (!std::filesystem::exists(dir + "/done_" + std::to_string(r)) &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(20ms);
      }
    }
    std::printf("rank 1 done sleeping\n");
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::vector<float> data(12, 1.0f);
  int code = 0;
  try {
    group->all_reduce(data.data(), data.size(), DType::kFloat32);
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: all_reduce without rank 1 succeeded\n", rank);
    code = 1;
  } catch (const ddp::Error& e) {
    std::printf("EXPECTED ERROR rank=%d: %s\n", rank, e.what());
  }
  std::fflush(stdout);
  if (!dir.empty()) touch(dir + "/done_" + std::to_string(rank));
  std::_Exit(code);  // the group is broken: do not wait on it at exit
}

int run_mismatch(int odd) {
  auto group = ddp::init();
  const int rank = group->rank();
  std::vector<float> data(5, 1.0f);
  try {
    group->all_reduce(data.data(), rank == odd ? 5 : 4, DType::kFloat32);
    std::fprintf(
        stderr,
        "COLLECTIVES FAILED rank=%d: a mismatched all_reduce succeeded (is DDP_DEBUG=1 set?)\n",
        rank);
    return 1;
  } catch (const ddp::Error& e) {
    std::printf("EXPECTED ERROR rank=%d: %s\n", rank, e.what());
  }
  std::fflush(stdout);
  // Nobody ran the mismatched collective: the group goes on.
  std::vector<float> ok(4, 1.0f);
  group->all_reduce(ok.data(), ok.size(), DType::kFloat32);
  if (ok[3] != static_cast<float>(group->size())) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: all_reduce after the mismatch gave %f\n",
                 rank, ok[3]);
    return 1;
  }
  group.reset();
  ddp::shutdown();
  std::printf("MISMATCH OK rank=%d\n", rank);
  return 0;
}

// A float32 integer in [-512, 511] that looks random across positions and
// ranks: sums over a few ranks are exact whatever the order of additions.
float large_value(int rank, std::size_t i) {
  auto x = static_cast<std::uint32_t>(i + static_cast<std::size_t>(rank) * 977u) * 2654435761u;
  return static_cast<float>(static_cast<int>((x >> 11) & 1023u) - 512);
}

std::uint64_t fnv1a(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Large all_reduces: past the shm backend's single-copy limit, across its
// chunks, in place in allocate()d memory (zero-copy) and in private memory.
int run_large(std::size_t max_bytes) {
  auto group = ddp::init();
  ddp::ProcessGroup& pg = *group;
  const int rank = pg.rank(), n = pg.size();
  try {
    for (bool shared : {false, true}) {
      const std::string where = shared ? " in allocate()d memory" : " in private memory";
      for (std::size_t bytes :
           {std::size_t{4} << 10, (std::size_t{32} << 10) + 4, (std::size_t{1} << 20) + 12,
            (std::size_t{5} << 20) + 4, std::size_t{64} << 20}) {
        if (bytes > max_bytes) continue;
        const std::size_t count = bytes / 4;
        std::vector<float> own;
        std::shared_ptr<void> block;
        void* data = nullptr;
        if (shared) {
          block = pg.allocate(bytes);
          data = block.get();
        } else {
          own.resize(count);
          data = own.data();
        }
        auto* f = static_cast<float*>(data);
        for (std::size_t i = 0; i < count; ++i) f[i] = large_value(rank, i);
        pg.all_reduce(f, count, DType::kFloat32, ReduceOp::kSum);
        for (std::size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += large_value(r, i);
          if (f[i] != want) {
            fail("all_reduce sum of " + std::to_string(count) + " float32" + where + ": element " +
                 std::to_string(i) + " is " + std::to_string(f[i]) + ", expected " +
                 std::to_string(want));
          }
        }
        auto* k = static_cast<std::int32_t*>(data);
        for (std::size_t i = 0; i < count; ++i)
          k[i] = static_cast<std::int32_t>(large_value(rank, i)) * 1000;
        pg.all_reduce(k, count, DType::kInt32, ReduceOp::kMax);
        for (std::size_t i = 0; i < count; ++i) {
          std::int32_t want = std::numeric_limits<std::int32_t>::min();
          for (int r = 0; r < n; ++r)
            want = std::max(want, static_cast<std::int32_t>(large_value(r, i)) * 1000);
          if (k[i] != want) {
            fail("all_reduce max of " + std::to_string(count) + " int32" + where + ": element " +
                 std::to_string(i) + " is " + std::to_string(k[i]) + ", expected " +
                 std::to_string(want));
          }
        }
      }
      // Fractions: the order of additions shows in the bits, which must still agree on every rank.
      const std::size_t count = ((std::size_t{5} << 20) + 4) / 4;
      std::vector<float> own;
      std::shared_ptr<void> block;
      float* f;
      if (shared) {
        block = pg.allocate(count * 4);
        f = static_cast<float*>(block.get());
      } else {
        own.resize(count);
        f = own.data();
      }
      for (std::size_t i = 0; i < count; ++i)
        f[i] = static_cast<float>(std::sin(0.37 * i + rank) * (1 + 0.3 * rank));
      pg.all_reduce(f, count, DType::kFloat32, ReduceOp::kSum);
      auto mine = static_cast<std::int64_t>(fnv1a(f, count * 4));
      std::vector<std::int64_t> all(n);
      pg.all_gather(&mine, all.data(), 1, DType::kInt64);
      for (int r = 0; r < n; ++r) {
        if (all[r] != mine) {
          fail("float32 sum of " + std::to_string(count) + " fractions" + where + ": rank " +
               std::to_string(r) + "'s bits differ from rank " + std::to_string(rank) + "'s");
        }
      }
    }
  } catch (const CheckFailed& f) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: %s\n", rank, f.what.c_str());
    return 1;
  }
  const std::string backend = pg.backend_name();
  group.reset();
  ddp::shutdown();
  std::printf("LARGE OK rank=%d world=%d backend=%s\n", rank, n, backend.c_str());
  return 0;
}

// Rank 1 dies (SIGKILL, no goodbye) in the middle of a run of all_reduces; the
// others must fail with an error naming it, long before the timeout. SIGTERM is
// ignored so ddprun's teardown (SIGTERM, then SIGKILL after its grace period)
// does not end the survivors before they report.
int run_kill() {
  signal(SIGTERM, SIG_IGN);
  auto group = ddp::init();
  const int rank = group->rank(), n = group->size();
  if (n < 2) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: kill mode needs at least 2 ranks\n", rank);
    return 1;
  }
  std::atomic<int> finished{0};
  std::thread killer;
  if (rank == 1) {
    killer = std::thread([&finished] {
      for (int seen = finished.load(); seen < 3; seen = finished.load()) finished.wait(seen);
      raise(SIGKILL);
    });
  }
  std::vector<float> data(std::size_t{4} << 20, 1.0f);  // 16 MiB: many chunks per call
  for (int iteration = 0; iteration < 100000; ++iteration) {
    const auto start = std::chrono::steady_clock::now();
    try {
      group->all_reduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kMax);
    } catch (const ddp::Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      std::printf("EXPECTED ERROR rank=%d: %s\n", rank, e.what());
      std::printf("FAILED AFTER ms=%lld iteration=%d\n", static_cast<long long>(ms), iteration);
      std::fflush(stdout);
      std::_Exit(rank == 1 ? 1 : 0);  // the group is broken: do not wait on it at exit
    }
    finished.fetch_add(1);
    finished.notify_all();
  }
  std::fprintf(stderr,
               "COLLECTIVES FAILED rank=%d: every all_reduce succeeded, rank 1 never died\n", rank);
  std::fflush(stderr);
  std::_Exit(1);
}

// All-reduces (int64 sums of each rank's number, small and 1 MiB), checked,
// with a barrier every tenth, for `seconds`; prints SOAK OK rank=R
// iterations=N, or COLLECTIVES FAILED at the first wrong result.
int run_soak(double seconds) {
  auto group = ddp::init();
  const int rank = group->rank(), n = group->size();
  const std::int64_t expected = static_cast<std::int64_t>(n) * (n + 1) / 2;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int iterations = 0;
  // Every rank runs the same number of iterations: rank 0 decides when to stop.
  for (std::int64_t go = 1; go != 0; ++iterations) {
    for (std::size_t count : {std::size_t{16}, std::size_t{1} << 17}) {
      std::vector<std::int64_t> data(count, rank + 1);
      group->all_reduce(data.data(), count, DType::kInt64, ReduceOp::kSum);
      for (std::int64_t v : data) {
        if (v != expected) {
          std::fprintf(stderr,
                       "COLLECTIVES FAILED rank=%d: iteration %d: sum %lld, expected %lld\n", rank,
                       iterations, static_cast<long long>(v), static_cast<long long>(expected));
          return 1;
        }
      }
    }
    if (iterations % 10 == 0) group->barrier();
    go = rank == 0 && std::chrono::steady_clock::now() >= end ? 0 : 1;
    group->all_reduce(&go, 1, DType::kInt64, ReduceOp::kMin);
  }
  std::printf("SOAK OK rank=%d iterations=%d\n", rank, iterations);
  return 0;
}

// Rank 1 stops itself (SIGSTOP) after 3 all-reduces; the others go on into
// the 4th and wait there: a hang for --hang_timeout to find and name.
int run_stop() {
  auto group = ddp::init();
  const int rank = group->rank();
  std::vector<float> data(1024, 1.0f);
  for (int iteration = 0; iteration < 100000; ++iteration) {
    if (rank == 1 && iteration == 3) raise(SIGSTOP);
    group->all_reduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kMax);
  }
  std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: rank 1 never stopped\n", rank);
  return 1;
}

// A second group over the same ranks (ddp::new_group) with its own variants
// beside the default group: both sum right and each reports its own choice.
int run_groups() {
  auto group = ddp::init();
  ddp::InitOptions options;
  options.shm_algorithm = "chunked";
  auto second = ddp::new_group("second", options);
  const int rank = group->rank(), n = group->size();
  const std::size_t bytes = std::size_t{1} << 20, count = bytes / sizeof(float);
  for (ddp::ProcessGroup* pg : {group.get(), second.get(), group.get()}) {
    auto block = pg->allocate(bytes);
    auto* f = static_cast<float*>(block.get());
    std::fill(f, f + count, static_cast<float>(rank + 1));
    pg->all_reduce(f, count, DType::kFloat32, ReduceOp::kSum);
    if (f[0] != static_cast<float>(n * (n + 1) / 2) || f[count - 1] != f[0]) {
      std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: all_reduce on group %s gave %f\n", rank,
                   pg == group.get() ? "default" : "second", static_cast<double>(f[0]));
      return 1;
    }
  }
  std::printf("GROUPS rank=%d default=%s second=%s\n", rank,
              group->algorithm_for("all_reduce", bytes).c_str(),
              second->algorithm_for("all_reduce", bytes).c_str());
  std::string refused = "nothing";
  try {
    ddp::new_group("default");
  } catch (const ddp::Error& e) {
    refused = e.what();
  }
  std::printf("REFUSED rank=%d %s\n", rank, refused.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  try {
    if (mode == "all" && argc == 2) return run_all(false);
    if (mode == "single" && argc == 2) return run_all(true);
    if (mode == "timeout" && argc == 4 && std::string(argv[2]) == "sleep")
      return run_timeout("sleep", argv[3]);
    if (mode == "timeout" && argc == 3 && std::string(argv[2]) == "exit")
      return run_timeout("exit", "");
    if (mode == "mismatch" && argc <= 3) return run_mismatch(argc == 3 ? std::atoi(argv[2]) : 1);
    if (mode == "large" && argc <= 3) {
      return run_large((argc == 3 ? std::strtoull(argv[2], nullptr, 10) : 64) << 20);
    }
    if (mode == "kill" && argc == 2) return run_kill();
    if (mode == "stop" && argc == 2) return run_stop();
    if (mode == "soak" && argc == 3) return run_soak(std::atof(argv[2]));
    if (mode == "groups" && argc == 2) return run_groups();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: %s\n", ddp::rank(), e.what());
    return 1;
  }
  return usage();
}
