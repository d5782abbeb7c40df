// NCCL: the unique-id exchange runs everywhere NCCL was built (ncclGetUniqueId
// needs no GPU); communicator creation and collectives need a GPU and skip
// with the reason otherwise.

#include <gtest/gtest.h>

#include "visible_gpus.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_id.h"
#include "core/backend.h"
#include "core/init_parts.h"
#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/process_group.h"
#include "ddp/store.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace ddp {
namespace {

using namespace std::chrono_literals;

using ::ddp::testing::visible_gpus;

#ifdef DDP_HAVE_NCCL
// A NCCL communicator of one on device 0 (its id through a store in memory).
std::unique_ptr<Backend> nccl_backend_of_one() {
  BackendConfig config;
  config.rank = 0;
  config.size = 1;
  config.store = make_memory_store();
  config.timeout = 60s;
  return make_nccl_backend(config);
}
#endif

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
  auto backend = nccl_backend_of_one();
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

#ifdef DDP_HAVE_NCCL
// Bytes of `count` elements of `dtype` holding small integers (exact in every
// dtype, including float16 and bfloat16): element i is (i % 7) + 1.
std::vector<unsigned char> small_integers(DType dtype, std::size_t count) {
  std::vector<unsigned char> out(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>(i % 7) + 1;
    unsigned char* at = out.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kFloat32: {
        const float f = v;
        std::memcpy(at, &f, 4);
        break;
      }
      case DType::kFloat64: {
        const double d = v;
        std::memcpy(at, &d, 8);
        break;
      }
      case DType::kInt32: {
        const std::int32_t x = v;
        std::memcpy(at, &x, 4);
        break;
      }
      case DType::kInt64: {
        const std::int64_t x = v;
        std::memcpy(at, &x, 8);
        break;
      }
      case DType::kUInt8:
        *at = static_cast<unsigned char>(v);
        break;
      case DType::kFloat16: {  // v in 1..7: exponent 15 + e, mantissa from v's bits
        int e = 0;
        while ((v >> (e + 1)) != 0) ++e;
        const std::uint16_t h =
            static_cast<std::uint16_t>(((15 + e) << 10) | ((v << (10 - e)) & 0x3ff));
        std::memcpy(at, &h, 2);
        break;
      }
      case DType::kBFloat16: {  // the top half of the float32
        const float f = v;
        std::uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const std::uint16_t b = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(at, &b, 2);
        break;
      }
    }
  }
  return out;
}
#endif

// Communicators come and go in one process (a rebuilt process group makes a
// new one after the old is gone): each is destroyed completely, and the next
// works. NCCL refuses to destroy a non-blocking communicator whose finalize
// has not completed, which once broke every later communicator.
TEST(Nccl, CommunicatorsMadeOneAfterAnotherInOneProcessEachWork) {
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  if (visible_gpus() == 0) GTEST_SKIP() << "no GPU visible: NCCL communicators need one";
#ifdef DDP_HAVE_NCCL
  for (int round = 0; round < 3; ++round) {
    auto backend = nccl_backend_of_one();
    auto buffer = backend->allocate(4 * sizeof(float));
    std::vector<float> host = {1, 2, 3, static_cast<float>(round)}, back(4);
    ASSERT_EQ(cudaMemcpy(buffer.get(), host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_NO_THROW(backend->all_reduce(buffer.get(), 4, DType::kFloat32, ReduceOp::kSum))
        << "round " << round;
    ASSERT_EQ(cudaMemcpy(back.data(), buffer.get(), 16, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host) << "round " << round;
  }
#endif
}

// A world of one on a real GPU: every collective, every dtype, every op runs
// through NCCL on device memory and gives back its input (the only rank's
// values), which proves the dtype/op mapping and the device paths run.
TEST(Nccl, EveryCollectiveDtypeAndOpInAWorldOfOneOnAGpu) {
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  if (visible_gpus() == 0) GTEST_SKIP() << "no GPU visible: NCCL communicators need one";
#ifdef DDP_HAVE_NCCL
  auto backend = nccl_backend_of_one();
  constexpr std::size_t kCount = 1000;
  auto in = backend->allocate(kCount * 8);
  auto out = backend->allocate(kCount * 8);
  auto upload = [&](void* device, const std::vector<unsigned char>& host) {
    ASSERT_EQ(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  };
  auto download = [&](const void* device, std::size_t bytes) {
    std::vector<unsigned char> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  // Each call on its own: one failing combination is reported, the others still run.
  auto check = [&](const std::string& what, const std::function<void()>& call, const void* result,
                   const std::vector<unsigned char>& expected) {
    try {
      call();
      EXPECT_EQ(download(result, expected.size()), expected) << what;
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": " << e.what();
    }
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                      DType::kInt32, DType::kInt64, DType::kUInt8}) {
    const auto values = small_integers(dtype, kCount);
    const std::size_t bytes = values.size();
    const std::string type = dtype_name(dtype);
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      const std::string suffix = type + " op " + std::to_string(static_cast<int>(op));
      upload(in.get(), values);
      check(
          "all_reduce" + suffix, [&] { backend->all_reduce(in.get(), kCount, dtype, op); },
          in.get(), values);
      upload(in.get(), values);
      check(
          "reduce" + suffix, [&] { backend->reduce(in.get(), kCount, dtype, op, 0); }, in.get(),
          values);
      upload(in.get(), values);
      ASSERT_EQ(cudaMemset(out.get(), 0, bytes), cudaSuccess);
      check(
          "reduce_scatter" + suffix,
          [&] { backend->reduce_scatter(in.get(), out.get(), kCount, dtype, op); }, out.get(),
          values);
    }
    upload(in.get(), values);
    check(
        "broadcast " + type, [&] { backend->broadcast(in.get(), kCount, dtype, 0); }, in.get(),
        values);
    ASSERT_EQ(cudaMemset(out.get(), 0, bytes), cudaSuccess);
    check(
        "all_gather " + type, [&] { backend->all_gather(in.get(), out.get(), kCount, dtype); },
        out.get(), values);
  }
  backend->barrier();
#endif
}

// A rebuilt group is made with a short connect_timeout (its members all
// arrived; one that dies meanwhile must fail the creation soon, not after the
// collective timeout): a group of two whose rank 1 never comes ends within
// connect_timeout, aborting NCCL's unfinished initialisation.
TEST(Nccl, ACreationWhosePeerNeverComesEndsAfterTheConnectTimeout) {
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  if (visible_gpus() == 0) GTEST_SKIP() << "no GPU visible: NCCL communicators need one";
#ifdef DDP_HAVE_NCCL
  BackendConfig config;
  config.rank = 0;
  config.size = 2;
  config.local_size = 1;  // rank 1 would be on another host: no pid to watch
  config.store = make_memory_store();
  config.timeout = 60s;
  config.connect_timeout = 1s;
  const auto start = std::chrono::steady_clock::now();
  try {
    make_nccl_backend(config);
    FAIL() << "a group of two was made without its rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not complete within 1000 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "waited for the collective timeout";
#endif
}

// A group of one that names nccl is a NCCL group (a real communicator of
// one, device memory from allocate()); init() makes one when DDP_BACKEND or
// InitOptions names nccl, and a local group for auto.
TEST(Nccl, AWorldOfOneNamingNcclGetsANcclGroup) {
  InitOptions named;
  named.backend = "nccl";
  unsetenv("DDP_BACKEND");
  EXPECT_EQ(detail::group_options("default", named).backend, "nccl");
  EXPECT_EQ(detail::group_options("default", InitOptions{}).backend, "local");
  setenv("DDP_BACKEND", "nccl", 1);
  EXPECT_EQ(detail::group_options("default", InitOptions{}).backend, "nccl");
  setenv("DDP_BACKEND", "auto", 1);
  EXPECT_EQ(detail::group_options("default", InitOptions{}).backend, "local");
  unsetenv("DDP_BACKEND");
  if (!nccl_available())
    GTEST_SKIP() << "built without NCCL (CUDA Toolkit/NCCL not found at build time)";
  if (visible_gpus() == 0) {
    // No silent fallback to the local backend: the error says what is missing.
    EXPECT_THROW(ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("nccl")), Error);
    return;
  }
#ifdef DDP_HAVE_NCCL
  auto group = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("nccl"));
  EXPECT_EQ(group->backend_name(), "nccl");
  auto buffer = group->allocate(4 * sizeof(float));
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, buffer.get()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  std::vector<float> host = {1, 2, 3, 4}, back(4);
  ASSERT_EQ(cudaMemcpy(buffer.get(), host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  group->all_reduce(buffer.get(), 4, DType::kFloat32, ReduceOp::kAvg);
  ASSERT_EQ(cudaMemcpy(back.data(), buffer.get(), 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
#endif
}

}  // namespace
}  // namespace ddp
