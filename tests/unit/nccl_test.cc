// NCCL: the unique-id exchange runs everywhere NCCL was built (ncclGetUniqueId
// needs no GPU); communicator creation and collectives need a GPU and skip
// with the reason otherwise.

#include <gtest/gtest.h>

#include "visible_gpus.h"

#include <thread>
#include <vector>

#include "backends/nccl/nccl_id.h"
#include "core/backend.h"
#include "ddp/common/error.h"
#include "ddp/store.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ddp {
namespace {

using namespace std::chrono_literals;

using ::ddp::testing::visible_gpus;

TEST(Nccl, UniqueIdIsSharedThroughTheStoreWithoutAGpu) {
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  auto store = make_prefix_store(make_memory_store(), "run/round1/default");
  constexpr int kRanks = 3;
  std::vector<std::string> ids(kRanks);
  std::vector<std::thread> threads;
  for (int r = kRanks - 1; r >= 0; --r) {  // rank 0 last: the others must wait for it
    threads.emplace_back([&, r] { ids[r] = exchange_nccl_unique_id(*store, r, 10s); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ids[0].size(), 128u);
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
  EXPECT_NE(ids[0], std::string(128, '\0'));
}

TEST(Nccl, MissingRankZeroTimesOutNamingTheKey) {
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  auto store = make_memory_store();
  try {
    exchange_nccl_unique_id(*store, 1, 200ms);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl_unique_id"), std::string::npos) << e.what();
  }
}

TEST(Nccl, BackendRefusedClearlyWithoutNccl) {
  if (nccl_available()) GTEST_SKIP() << "this build has NCCL";
  BackendConfig config;
  config.size = 2;
  config.store = make_memory_store();
  EXPECT_THROW(make_nccl_backend(config), Error);
}

TEST(Nccl, CommunicatorAndAllReduceOnAGpu) {
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  if (visible_gpus() == 0) GTEST_SKIP() << "no GPU visible: NCCL communicators need one";
#ifdef DDP_HAVE_NCCL
  BackendConfig config;
  config.rank = 0;
  config.size = 1;
  config.store = make_memory_store();
  config.timeout = 60s;
  auto backend = make_nccl_backend(config);
  auto buffer = backend->allocate(4 * sizeof(float));
  std::vector<float> host = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpy(buffer.get(), host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  backend->all_reduce(buffer.get(), 4, DType::kFloat32, ReduceOp::kSum);
  backend->barrier();
  std::vector<float> back(4);
  ASSERT_EQ(cudaMemcpy(back.data(), buffer.get(), 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);  // a world of one: the sum is the input
#endif
}

}  // namespace
}  // namespace ddp
