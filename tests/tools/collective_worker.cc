// A worker for libddp's collective integration tests, run under ddprun (or
// alone, as a world of one). Each mode is one scenario of the collective
// tests; "all" (collective_worker_all.cc) checks every collective for every
// dtype and op against values computed from the ranks' known inputs. See
// usage() for the modes. A failed check prints
// "COLLECTIVES FAILED rank=R: <check>: <detail>" to stderr and exits 1.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective_worker.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"

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

using collective_worker::CheckFailed;
using collective_worker::fail;

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
    if (mode == "all" && argc == 2) return collective_worker::run_all(false);
    if (mode == "single" && argc == 2) return collective_worker::run_all(true);
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
