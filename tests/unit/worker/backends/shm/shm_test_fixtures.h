// The shm backend's thread-rank tests share these: helpers that compute the
// expected values, the memory a buffer lives in (private, allocate()d, mixed),
// and the fixtures whose teardown checks that no /dev/shm entry of the test's
// run is left behind. Every rank is a thread of the test process and maps the
// node's shared segment itself, as a process would.
#pragma once

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
#include "unique_run_id.h"

namespace ddp::shm_test {

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

using ::ddp::testing::unique_run_id;

using ::ddp::testing::error_of;

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline double all_reduce_reference(ReduceOp op, DType dtype, int world, std::size_t i) {
  return reference(op, dtype, world, [&](int r) { return input_value(r, i, dtype); });
}

// Where a collective's buffer lives: private memory (the copying paths), memory
// from allocate() on every rank (zero-copy), or allocate() on even ranks only
// (not every buffer is in the segment: the copying path again).
enum class Memory { kPrivate, kShared, kMixed };
constexpr Memory kMemories[] = {Memory::kPrivate, Memory::kShared, Memory::kMixed};
inline const char* memory_name(Memory m) {
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
inline bool in_segment(Memory m, int rank) {
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
inline void all_reduce_in(ProcessGroup& pg, Buffer& buf, ReduceOp op, Memory memory) {
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
inline std::vector<std::size_t> boundary_counts(DType dtype) {
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
  const std::string run_id_ = unique_run_id("shmt");
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

}  // namespace ddp::shm_test
