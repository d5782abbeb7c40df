// A process group of one rank (every collective local), bad arguments
// rejected before anything runs, and what a group does to SIGPIPE.

#include <gtest/gtest.h>
#include <signal.h>

#include "error_of.h"
#include "thread_ranks.h"
#include "typed_buffer.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

using ::ddp::testing::Buffer;
using ::ddp::testing::expect_elements;
using ::ddp::testing::gloo_options;
using ::ddp::testing::input_value;
using ::ddp::testing::kDTypes;
using ::ddp::testing::kOps;
using ::ddp::testing::on_ranks;

// ---- A world of one: the local backend, no store, every collective local.

std::shared_ptr<ProcessGroup> world_of_one() {
  ProcessGroupOptions options;
  options.backend = "local";
  return ProcessGroup::create(0, 1, nullptr, options);
}

TEST(WorldOfOne, ReductionsAndBroadcastsLeaveDataAsItIs) {
  auto pg = world_of_one();
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      Buffer buf(dtype, 7);
      buf.fill(0, 7, [&](std::size_t i) { return input_value(0, i, dtype); });
      pg->all_reduce(buf.data(), 7, dtype, op);
      expect_elements(
          buf, 0, 7, [&](std::size_t i) { return input_value(0, i, dtype); },
          std::string("all_reduce ") + op_name(op));
      pg->reduce(buf.data(), 7, dtype, op, 0);
      expect_elements(
          buf, 0, 7, [&](std::size_t i) { return input_value(0, i, dtype); },
          std::string("reduce ") + op_name(op));
      Buffer out(dtype, 7);
      pg->reduce_scatter(buf.data(), out.data(), 7, dtype, op);
      expect_elements(
          out, 0, 7, [&](std::size_t i) { return input_value(0, i, dtype); },
          std::string("reduce_scatter ") + op_name(op));
    }
    Buffer buf(dtype, 3);
    buf.fill(0, 3, [&](std::size_t i) { return input_value(0, i, dtype); });
    pg->broadcast(buf.data(), 3, dtype, 0);
    expect_elements(
        buf, 0, 3, [&](std::size_t i) { return input_value(0, i, dtype); }, "broadcast");
  }
}

TEST(WorldOfOne, GathersScattersAndAllToAllCopyInputToOutput) {
  auto pg = world_of_one();
  for (DType dtype : kDTypes) {
    Buffer in(dtype, 5);
    in.fill(0, 5, [&](std::size_t i) { return input_value(0, i, dtype); });
    auto same = [&](std::size_t i) { return input_value(0, i, dtype); };
    Buffer a(dtype, 5), b(dtype, 5), c(dtype, 5), d(dtype, 5);
    pg->all_gather(in.data(), a.data(), 5, dtype);
    pg->gather(in.data(), b.data(), 5, dtype, 0);
    pg->scatter(in.data(), c.data(), 5, dtype, 0);
    pg->all_to_all(in.data(), d.data(), 5, dtype);
    expect_elements(a, 0, 5, same, "all_gather");
    expect_elements(b, 0, 5, same, "gather");
    expect_elements(c, 0, 5, same, "scatter");
    expect_elements(d, 0, 5, same, "all_to_all");
  }
}

TEST(WorldOfOne, ObjectsBarrierAndAsyncWorkAreLocal) {
  auto pg = world_of_one();
  pg->barrier();
  std::string bytes("a\0b", 3);
  pg->broadcast_object(bytes, 0);
  EXPECT_EQ(bytes, std::string("a\0b", 3));
  EXPECT_EQ(pg->all_gather_object(bytes), std::vector<std::string>{bytes});
  EXPECT_EQ(pg->all_gather_object(""), std::vector<std::string>{""});
  float x = 2.5f;
  auto work = pg->all_reduce_async(&x, 1, DType::kFloat32, ReduceOp::kAvg);
  EXPECT_TRUE(work->wait(5s));
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(x, 2.5f);
  EXPECT_TRUE(pg->barrier_async()->wait(5s));
}

TEST(WorldOfOne, GlooWithoutAStoreIsAlsoLocal) {
  auto pg = ProcessGroup::create(0, 1, nullptr, gloo_options());
  std::int32_t in[2] = {4, 5}, out[2] = {0, 0};
  pg->all_gather(in, out, 2, DType::kInt32);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[1], 5);
}

TEST(WorldOfOne, AllocateGivesAlignedWritableMemory) {
  auto pg = world_of_one();
  auto p = pg->allocate(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p.get()) % 64, 0u);
  std::memset(p.get(), 7, 1000);
  EXPECT_NE(pg->allocate(0), nullptr);
}

// ---- Bad arguments fail at once with an error naming what is wrong.

using ::ddp::testing::error_of;

TEST(ProcessGroupErrors, BadRankSizeBackendOrStoreAreRejected) {
  EXPECT_NE(error_of([] {
              ProcessGroup::create(1, 1, nullptr, gloo_options());
            }).find("rank 1 is outside [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ProcessGroup::create(-1, 2, make_memory_store(), gloo_options());
            }).find("rank -1"),
            std::string::npos);
  EXPECT_NE(error_of([] { ProcessGroup::create(0, 0, nullptr, gloo_options()); }).find("size 0"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { ProcessGroup::create(0, 2, nullptr, gloo_options()); }).find("needs a store"),
      std::string::npos);
  ProcessGroupOptions mpi = gloo_options();
  mpi.backend = "mpi";
  EXPECT_NE(error_of([&] { ProcessGroup::create(0, 2, make_memory_store(), mpi); }).find("'mpi'"),
            std::string::npos);
}

TEST(ProcessGroupErrors, RootOutsideTheWorldIsRejectedBeforeAnythingRuns) {
  auto pg = world_of_one();
  float x = 1;
  EXPECT_NE(error_of([&] {
              pg->broadcast(&x, 1, DType::kFloat32, 1);
            }).find("broadcast: root 1 is outside [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              pg->reduce(&x, 1, DType::kFloat32, ReduceOp::kSum, -1);
            }).find("reduce: root -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pg->gather(&x, &x, 1, DType::kFloat32, 2); }).find("gather: root 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pg->scatter(&x, &x, 1, DType::kFloat32, 5); }).find("scatter: root 5"),
            std::string::npos);
  // The group still works.
  pg->barrier();
}

// SIGPIPE: ignored by a group of several ranks when it had its default action
// (a Gloo write to a peer that exited must fail the collective, not kill the
// rank), left alone when the program chose its own.
void record_sigpipe(int) {}

void* sigpipe_handler() {
  struct sigaction current {};
  EXPECT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  return reinterpret_cast<void*>(current.sa_handler);
}

TEST(ProcessGroupSignals, SeveralRanksIgnoreSigpipeOnlyWhereItHadItsDefaultAction) {
  signal(SIGPIPE, SIG_DFL);
  world_of_one();
  EXPECT_EQ(sigpipe_handler(), reinterpret_cast<void*>(SIG_DFL)) << "a world of one has no sockets";
  on_ranks(2, [](ProcessGroup& pg) { pg.barrier(); });
  EXPECT_EQ(sigpipe_handler(), reinterpret_cast<void*>(SIG_IGN));

  signal(SIGPIPE, record_sigpipe);
  on_ranks(2, [](ProcessGroup& pg) { pg.barrier(); });
  EXPECT_EQ(sigpipe_handler(), reinterpret_cast<void*>(record_sigpipe));
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace
}  // namespace ddp
