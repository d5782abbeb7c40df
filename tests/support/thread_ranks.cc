#include "thread_ranks.h"

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp::testing {

ProcessGroupOptions gloo_options(std::chrono::milliseconds timeout) {
  ProcessGroupOptions options;
  options.backend = "gloo";
  options.timeout = timeout;
  return options;
}

void on_ranks(int world, const std::function<void(ProcessGroup&)>& body,
              const ProcessGroupOptions& options) {
  // One in-memory store for the whole test program; every run takes a prefix of
  // its own, so groups never read each other's addresses.
  static std::shared_ptr<Store> shared = make_memory_store();
  static std::atomic<int> runs{0};
  auto store = make_prefix_store(shared, "run" + std::to_string(runs++));
  std::latch finished(world);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<ProcessGroup> group;
      try {
        group = ProcessGroup::create(r, world, store, options);
        EXPECT_EQ(group->rank(), r);
        EXPECT_EQ(group->size(), world);
        body(*group);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(r) + " threw: " + e.what());
      }
      finished.arrive_and_wait();
      group.reset();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace ddp::testing
