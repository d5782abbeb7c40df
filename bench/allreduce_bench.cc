// nccl-tests-style sweep of libddp's all_reduce (float32, sum; --collective for
// reduce_scatter or all_gather): run under
// ddprun, e.g. `ddprun --nproc_per_node=2 allreduce_bench`. For each size it
// warms up, times `iters` calls per trial (the slowest rank's time counts),
// and rank 0 prints size, time, algbw and busbw = algbw * 2(n-1)/n — median
// over trials. Sizes: 8 B .. 256 MiB doubling (--min/--max to narrow).
// Also prints the library's own per-call overhead at 8 B in a world of one
// (local backend) and the 8 B time through the real backend.
// --buffers allocated (default: from ProcessGroup::allocate, i.e. device memory
// for nccl and the shared segment for shm, where an all-reduce runs in place)
// or private (plain host memory of this process: shm copies through its slots).
// --fresh: before every timed call each rank rewrites its whole input
// (untimed, then a barrier), as a backward pass writes its gradients; the
// time then includes moving the data between the cores' caches, which a
// loop over the same buffer hides (there each rank's share of an in-place
// all-reduce never leaves its own cache). Host buffers only.
// --collective all_reduce (default) | reduce_scatter | all_gather, with
// nccl-tests' conventions: size is the whole buffer (reduce_scatter's input,
// all_gather's output; size/n per rank), busbw = algbw * (n-1)/n for these
// two; all_gather runs in place (each rank's input is its slice of the
// output, as ParamShards does), reduce_scatter into a separate output.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/ddp.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int iterations_for(std::size_t bytes) {
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (1u << 20)) return 50;
  if (bytes <= (16u << 20)) return 8;
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t min_bytes = 8, max_bytes = 256u << 20;
  int trials = 5;
  std::string buffers = "allocated";
  std::string collective = "all_reduce";
  bool fresh = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--fresh") {  // the one flag without a value
      fresh = true;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* value = argv[++i];
    if (flag == "--buffers") buffers = value;
    if (flag == "--min") min_bytes = std::strtoull(value, nullptr, 10);
    if (flag == "--max") max_bytes = std::strtoull(value, nullptr, 10);
    if (flag == "--trials") trials = std::atoi(value);
    if (flag == "--collective") collective = value;
  }
  if (buffers != "allocated" && buffers != "private") {
    std::fprintf(stderr, "allreduce_bench: --buffers must be allocated or private, not '%s'\n", buffers.c_str());
    return 64;
  }
  if (collective != "all_reduce" && collective != "reduce_scatter" && collective != "all_gather") {
    std::fprintf(stderr, "allreduce_bench: --collective must be all_reduce, reduce_scatter or all_gather, not '%s'\n",
                 collective.c_str());
    return 64;
  }
  auto pg = ddp::init();
  const int n = pg->size();
  if (fresh && pg->backend_name() == "nccl") {
    std::fprintf(stderr, "allreduce_bench: --fresh rewrites host buffers; backend nccl's are device memory\n");
    return 64;
  }
  if (pg->rank() == 0) {
    std::printf("# libddp %s float32%s, backend %s, %d ranks, %s buffers%s, median of %d trials\n",
                collective.c_str(), collective == "all_gather" ? "" : " sum", pg->backend_name().c_str(), n, buffers.c_str(),
                fresh ? " rewritten by their rank before every call (--fresh)" : "", trials);
    std::printf("%12s %12s %10s %10s\n", "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  }
  // The backend's own memory: host memory for gloo, device memory for nccl (so a
  // GPU run times NCCL, not host-to-device staging). Its values do not matter
  // for timing; on the host they are set to 1.
  const std::size_t capacity = max_bytes / sizeof(float) + 1;
  // reduce_scatter's output follows its input in the same block.
  const std::size_t floats = collective == "reduce_scatter" ? 2 * capacity : capacity;
  std::shared_ptr<void> memory = buffers == "allocated" ? pg->allocate(floats * sizeof(float))
                                                      : std::shared_ptr<void>(new float[floats], [](void* p) {
                                                          delete[] static_cast<float*>(p);
                                                        });
  float* buffer = static_cast<float*>(memory.get());
  if (pg->backend_name() != "nccl") std::fill(buffer, buffer + floats, 1.0f);
  const int me = pg->rank();
  const bool all_reduce = collective == "all_reduce";
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    // Elements per rank of reduce_scatter's output / all_gather's input, and in all.
    const std::size_t per = std::max<std::size_t>(1, bytes / sizeof(float) / (all_reduce ? 1 : n));
    const std::size_t count = all_reduce ? per : per * n;
    if (count > capacity) break;
    auto call = [&] {
      if (all_reduce) {
        pg->all_reduce(buffer, count, ddp::DType::kFloat32);
      } else if (collective == "reduce_scatter") {
        pg->reduce_scatter(buffer, buffer + capacity, per, ddp::DType::kFloat32, ddp::ReduceOp::kSum);
      } else {
        pg->all_gather(buffer + static_cast<std::size_t>(me) * per, buffer, per, ddp::DType::kFloat32);
      }
    };
    // What a producer rewrites before each call under --fresh: the input.
    float* input = collective == "all_gather" ? buffer + static_cast<std::size_t>(me) * per : buffer;
    const std::size_t input_count = collective == "all_gather" ? per : count;
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
    double t = times[times.size() / 2];
    double algbw = static_cast<double>(count * sizeof(float)) / t / 1e9;
    double busbw = algbw * (all_reduce ? 2.0 : 1.0) * (n - 1) / n;
    if (pg->rank() == 0) std::printf("%12zu %12.1f %10.3f %10.3f\n", count * sizeof(float), t * 1e6, algbw, busbw);
    std::fflush(stdout);
  }
  // The library's own cost per call: the same path with a world of one.
  auto local = ddp::ProcessGroup::create(0, 1, nullptr, ddp::ProcessGroupOptions::of("local"));
  float word = 1;
  const int kCalls = 20000;
  auto start = Clock::now();
  for (int i = 0; i < kCalls; ++i) local->all_reduce(&word, 2, ddp::DType::kFloat32);
  if (pg->rank() == 0) {
    std::printf("# library overhead per blocking call (world of one, 8 B): %.2f us\n", seconds_since(start) / kCalls * 1e6);
  }
  ddp::shutdown();
  return 0;
}
