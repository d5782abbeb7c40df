// nccl-tests-style sweep of libddp's all_reduce (float32, sum; --collective for
// reduce_scatter, all_gather or broadcast): run under
// ddprun, e.g. `ddprun --nproc_per_node=2 allreduce_bench`. For each size it
// warms up, times `iters` calls per trial (the slowest rank's time counts),
// and rank 0 prints size, time, algbw and busbw = algbw * 2(n-1)/n — median
// over trials — and the algorithm the library ran that size with
// (ProcessGroup::algorithm_for after the size's calls, e.g. "pull (timed)";
// "-" where it names none: other backends, or groups spanning nodes).
// Sizes: 8 B .. 256 MiB doubling (--min/--max to narrow, in bytes).
// --trials N: trials per size (default 5).
// Also prints the library's own per-call overhead at 8 B in a world of one
// (local backend) and the 8 B time through the real backend.
// --buffers allocated (default: from ProcessGroup::allocate, i.e. device memory
// for nccl and the shared segment for shm, where an all-reduce runs in place)
// or private (plain host memory of this process: shm copies through its slots).
// --fresh: before every timed call each rank rewrites its whole input
// (untimed, then a barrier), as a backward pass writes its gradients; the
// time then includes moving the data between the cores' caches, which a
// loop over the same buffer hides (there each rank's share of an in-place
// all-reduce never leaves its own cache). Host buffers only. For broadcast
// only the root rewrites (its buffer is the one input).
// --collective all_reduce (default) | reduce_scatter | all_gather | broadcast,
// with nccl-tests' conventions: size is the whole buffer (reduce_scatter's
// input, all_gather's output; size/n per rank), busbw = algbw * (n-1)/n for
// these two; all_gather runs in place (each rank's input is its slice of the
// output, as ParamShards does), reduce_scatter into a separate output;
// broadcast sends the whole buffer from rank 0, in place, busbw = algbw.
// --algo LIST (shm only): the collective's algorithm variants side by side.
// LIST is comma-separated variant names (auto, push, pull, chunked, small;
// which the collective has: all_reduce push, pull, chunked, small;
// reduce_scatter pull, chunked; all_gather and broadcast pull, push,
// chunked), or `all`: auto and every variant of the collective. Each gets
// a process group of its own over the same ranks (ddp::new_group with the
// default group's backend and timeout, named bench-algo-VARIANT) with
// options.shm_algorithm = "COLLECTIVE=VARIANT" ("auto" for auto) and its own
// buffer (from that group's allocate() with --buffers allocated); the
// variants run one after the other at each size, each as a plain run does
// (warm-up, then the trials). Rank 0 prints one table: per size the busbw
// (GB/s) of each variant, then what auto chose for that size when auto is
// in the list. small only runs all_reduce calls of up to 32 KiB per rank
// (the single-copy limit): "-" above it. With --buffers private push and
// pull cannot run in place and go through the chunk slots, as chunked does;
// the algorithm and auto chose columns still name the variant that calls on
// allocated buffers would run (what algorithm_for reports).
// A variant the collective lacks is the library's error (exit 64).
// Malformed flags (unknown, a value missing or not a number) exit 64.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/ddp.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int iterations_for(std::size_t bytes) {
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (1u << 20)) return 50;
  if (bytes <= (16u << 20)) return 8;
  return 3;
}

// The shm backend's single-copy limit: its small all-reduce runs calls up to this per rank.
constexpr std::size_t kSmallBytes = 32u << 10;

// The variants each collective has (worker/src/backends/shm/algorithms.cc's lists, in their order).
std::vector<std::string> variants_of(const std::string& collective) {
  if (collective == "all_reduce") return {"push", "pull", "chunked", "small"};
  if (collective == "reduce_scatter") return {"pull", "chunked"};
  return {"pull", "push", "chunked"};  // all_gather, broadcast
}

// `text` as a whole number, or nullopt (empty, a sign, trailing characters, overflow).
std::optional<unsigned long long> whole_number(const char* text) {
  if (*text < '0' || *text > '9') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno != 0) return std::nullopt;
  return value;
}

// One column of the table: a group, its buffer and the variant it runs ("" for the default group).
struct Column {
  std::string variant;
  std::shared_ptr<ddp::ProcessGroup> group;
  std::shared_ptr<void> memory;
  float* buffer = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t min_bytes = 8, max_bytes = 256u << 20;
  int trials = 5;
  std::string buffers = "allocated";
  std::string collective = "all_reduce";
  std::string algo;    // --algo LIST
  bool sweep = false;  // --algo given: the variants' groups instead of the default group
  bool fresh = false;
  auto usage_error = [](const std::string& what) {
    std::fprintf(stderr, "allreduce_bench: %s\n", what.c_str());
    return 64;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--fresh") {  // the one flag without a value
      fresh = true;
      continue;
    }
    if (flag != "--buffers" && flag != "--min" && flag != "--max" && flag != "--trials" &&
        flag != "--collective" && flag != "--algo") {
      return usage_error(
          "unknown flag '" + flag +
          "' (flags: --min B, --max B, --trials N, --buffers allocated|private, --fresh, "
          "--collective C, --algo LIST)");
    }
    if (i + 1 >= argc) return usage_error(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--buffers") buffers = value;
    if (flag == "--collective") collective = value;
    if (flag == "--algo") {
      algo = value;
      sweep = true;
    }
    if (flag == "--min" || flag == "--max" || flag == "--trials") {
      const auto number = whole_number(value);
      if (!number || *number < 1 || (flag == "--trials" && *number > 1000000)) {
        return usage_error(flag + " must be a whole number >= 1, not '" + value + "'");
      }
      if (flag == "--min") min_bytes = *number;
      if (flag == "--max") max_bytes = *number;
      if (flag == "--trials") trials = static_cast<int>(*number);
    }
  }
  if (min_bytes > max_bytes) {
    return usage_error("--min " + std::to_string(min_bytes) + " is above --max " +
                       std::to_string(max_bytes));
  }
  if (buffers != "allocated" && buffers != "private") {
    return usage_error("--buffers must be allocated or private, not '" + buffers + "'");
  }
  if (collective != "all_reduce" && collective != "reduce_scatter" && collective != "all_gather" &&
      collective != "broadcast") {
    return usage_error(
        "--collective must be all_reduce, reduce_scatter, all_gather or broadcast, not '" +
        collective + "'");
  }
  // --algo's variants, in the order given (checked against the collective by the library).
  std::vector<std::string> variants;
  if (sweep) {
    if (algo == "all") {
      variants = variants_of(collective);
      variants.insert(variants.begin(), "auto");
    } else {
      std::size_t at = 0;
      while (at <= algo.size()) {
        const std::size_t comma = std::min(algo.find(',', at), algo.size());
        const std::string name = algo.substr(at, comma - at);
        if (name.empty()) return usage_error("--algo '" + algo + "' has an empty variant name");
        if (name == "all") {
          return usage_error("--algo: 'all' stands alone (auto and every variant of " + collective +
                             ")");
        }
        if (std::find(variants.begin(), variants.end(), name) != variants.end()) {
          return usage_error("--algo '" + algo + "' names " + name + " twice");
        }
        variants.push_back(name);
        at = comma + 1;
      }
    }
  }
  auto pg = ddp::init();
  const int n = pg->size();
  if (fresh && pg->backend_name() == "nccl") {
    std::fprintf(
        stderr,
        "allreduce_bench: --fresh rewrites host buffers; backend nccl's are device memory\n");
    return 64;
  }
  if (sweep && pg->backend_name() != "shm") {
    return usage_error("--algo compares the shm backend's variants; this run's backend is " +
                       pg->backend_name() +
                       " (launch several ranks per node with DDP_BACKEND=shm)");
  }
  // The backend's own memory: host memory for gloo, device memory for nccl (so a
  // GPU run times NCCL, not host-to-device staging). Its values do not matter
  // for timing; on the host they are set to 1.
  const std::size_t capacity = max_bytes / sizeof(float) + 1;
  // reduce_scatter's output follows its input in the same block.
  const std::size_t floats = collective == "reduce_scatter" ? 2 * capacity : capacity;
  auto buffer_of = [&](ddp::ProcessGroup& group) {
    return buffers == "allocated" ? group.allocate(floats * sizeof(float))
                                  : std::shared_ptr<void>(new float[floats], [](void* p) {
                                      delete[] static_cast<float*>(p);
                                    });
  };
  std::vector<Column> columns;
  if (!sweep) {
    columns.push_back({"", pg, buffer_of(*pg)});
  } else {
    for (const std::string& v : variants) {
      try {
        const std::string forced = v == "auto" ? "auto" : collective + "=" + v;
        ddp::InitOptions options;
        options.backend = pg->backend_name();
        options.timeout = pg->timeout();
        options.shm_algorithm = forced;
        auto group = ddp::new_group("bench-algo-" + v, options);
        columns.push_back({v, group, buffer_of(*group)});
      } catch (const ddp::Error& e) {  // the same on every rank: each exits here
        columns.clear();
        ddp::shutdown();
        return usage_error("--algo " + v + ": " + e.what());
      }
    }
  }
  for (Column& c : columns) {
    c.buffer = static_cast<float*>(c.memory.get());
    if (pg->backend_name() != "nccl") std::fill(c.buffer, c.buffer + floats, 1.0f);
  }
  const bool has_auto = std::find(variants.begin(), variants.end(), "auto") != variants.end();
  if (pg->rank() == 0) {
    const bool reduces = collective == "all_reduce" || collective == "reduce_scatter";
    std::printf("# libddp %s float32%s, backend %s, %d ranks, %s buffers%s, median of %d trials\n",
                collective.c_str(), reduces ? " sum" : "", pg->backend_name().c_str(), n,
                buffers.c_str(),
                fresh ? " rewritten by their rank before every call (--fresh)" : "", trials);
    if (!sweep) {
      std::printf("%12s %12s %10s %10s  %s\n", "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
                  "algorithm");
    } else {
      std::printf(
          "# busbw (GB/s) of each variant: its own group with options.shm_algorithm = "
          "%s=VARIANT%s\n",
          collective.c_str(),
          has_auto ? "; auto chose: what the auto group timed and picked for the size" : "");
      std::printf("%12s", "size(B)");
      for (const Column& c : columns) std::printf(" %10s", c.variant.c_str());
      if (has_auto) std::printf("  %s", "auto chose");
      std::printf("\n");
    }
  }
  const int me = pg->rank();
  const bool whole =
      collective == "all_reduce" || collective == "broadcast";  // every rank holds the whole buffer
  const double bus_factor = collective == "all_reduce"  ? 2.0 * (n - 1) / n
                            : collective == "broadcast" ? 1.0
                                                        : 1.0 * (n - 1) / n;
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    // Elements per rank of reduce_scatter's output / all_gather's input, and in all.
    const std::size_t per = std::max<std::size_t>(1, bytes / sizeof(float) / (whole ? 1 : n));
    const std::size_t count = whole ? per : per * n;
    if (count > capacity) break;
    // What algorithm_for is asked about: the bytes each rank contributes to one call.
    const std::size_t bytes_per_rank = (whole ? count : per) * sizeof(float);
    std::vector<double> medians;  // per column; < 0: not run
    for (Column& c : columns) {
      if (c.variant == "small" && bytes_per_rank > kSmallBytes) {
        medians.push_back(-1);
        continue;
      }
      ddp::ProcessGroup& group = *c.group;
      float* buffer = c.buffer;
      auto call = [&] {
        if (collective == "all_reduce") {
          group.all_reduce(buffer, count, ddp::DType::kFloat32);
        } else if (collective == "reduce_scatter") {
          group.reduce_scatter(buffer, buffer + capacity, per, ddp::DType::kFloat32,
                               ddp::ReduceOp::kSum);
        } else if (collective == "all_gather") {
          group.all_gather(buffer + static_cast<std::size_t>(me) * per, buffer, per,
                           ddp::DType::kFloat32);
        } else {
          group.broadcast(buffer, count, ddp::DType::kFloat32, 0);
        }
      };
      // What a producer rewrites before each call under --fresh: the input.
      float* input =
          collective == "all_gather" ? buffer + static_cast<std::size_t>(me) * per : buffer;
      const std::size_t input_count = collective == "all_gather"             ? per
                                      : collective == "broadcast" && me != 0 ? 0
                                                                             : count;
      int iters = iterations_for(bytes);
      for (int w = 0; w < std::min(iters, 5); ++w) call();
      std::vector<double> times;
      for (int t = 0; t < trials; ++t) {
        pg->barrier();
        double per_call = 0;
        if (fresh) {
          for (int i = 0; i < iters; ++i) {
            std::fill(input, input + input_count, static_cast<float>(i));
            pg->barrier();
            auto start = Clock::now();
            call();
            per_call += seconds_since(start) / iters;
          }
        } else {
          auto start = Clock::now();
          for (int i = 0; i < iters; ++i) call();
          per_call = seconds_since(start) / iters;
        }
        pg->all_reduce(&per_call, 1, ddp::DType::kFloat64, ddp::ReduceOp::kMax);
        times.push_back(per_call);
      }
      std::sort(times.begin(), times.end());
      medians.push_back(times[times.size() / 2]);
    }
    if (pg->rank() == 0) {
      auto algorithm_of = [&](const ddp::ProcessGroup& group) {
        const std::string a = group.algorithm_for(collective, bytes_per_rank);
        return a.empty() ? std::string("-") : a;
      };
      const double moved = static_cast<double>(count * sizeof(float));
      if (!sweep) {
        const double t = medians[0];
        const double algbw = moved / t / 1e9;
        std::printf("%12zu %12.1f %10.3f %10.3f  %s\n", count * sizeof(float), t * 1e6, algbw,
                    algbw * bus_factor, algorithm_of(*pg).c_str());
      } else {
        std::printf("%12zu", count * sizeof(float));
        for (double t : medians) {
          if (t < 0) {
            std::printf(" %10s", "-");
          } else {
            std::printf(" %10.3f", moved / t / 1e9 * bus_factor);
          }
        }
        for (const Column& c : columns) {
          if (c.variant == "auto") std::printf("  %s", algorithm_of(*c.group).c_str());
        }
        std::printf("\n");
      }
    }
    std::fflush(stdout);
  }
  columns.clear();  // the sweep's groups before the default one
  // The library's own cost per call: the same path with a world of one.
  auto local = ddp::ProcessGroup::create(0, 1, nullptr, ddp::ProcessGroupOptions::of("local"));
  float word = 1;
  const int kCalls = 20000;
  auto start = Clock::now();
  for (int i = 0; i < kCalls; ++i) local->all_reduce(&word, 2, ddp::DType::kFloat32);
  if (pg->rank() == 0) {
    std::printf("# library overhead per blocking call (world of one, 8 B): %.2f us\n",
                seconds_since(start) / kCalls * 1e6);
  }
  ddp::shutdown();
  return 0;
}
