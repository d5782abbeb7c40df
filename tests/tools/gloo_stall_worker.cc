// Two ranks on gloo, started by hand: rank 0 broadcasts 256 MiB; rank 1
// stops itself (SIGSTOP) as soon as the first bytes have landed, so rank 0's
// send is under way, its socket full, when the test SIGKILLs rank 1.
//
// Prints, rank 1: "STOPPED MID-TRANSFER" just before it stops, or "TRANSFER
// DONE BEFORE STOP" (exit 3) when the bytes all came first (the test then
// tries again). Rank 0: "EXPECTED ERROR: ..." and "FAILED AFTER ms=N" (exit
// 0) when its broadcast fails, "BROADCAST COMPLETED" (exit 2) if it does not.

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"

int main() {
  auto group = ddp::init();
  const int rank = group->rank();
  std::vector<std::uint8_t> data(std::size_t{256} << 20, rank == 0 ? 1 : 0);
  std::atomic<bool> over{false};
  std::thread stopper;
  if (rank == 1) {
    stopper = std::thread([&] {
      const volatile std::uint8_t* bytes = data.data();  // written by Gloo's thread
      while (bytes[0] == 0 && !over.load()) {
      }
      if (over.load() || bytes[data.size() - 1] != 0) {
        std::printf("TRANSFER DONE BEFORE STOP\n");
        std::fflush(stdout);
        std::_Exit(3);
      }
      std::printf("STOPPED MID-TRANSFER\n");
      std::fflush(stdout);
      raise(SIGSTOP);
    });
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    group->broadcast(data.data(), data.size(), ddp::DType::kUInt8, 0);
  } catch (const ddp::Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    std::printf("EXPECTED ERROR: %s\nFAILED AFTER ms=%lld\n", e.what(), static_cast<long long>(ms));
    std::fflush(stdout);
    std::_Exit(rank == 0 ? 0 : 1);  // the group is broken: do not wait on it at exit
  }
  over = true;
  if (stopper.joinable()) stopper.join();
  std::printf("BROADCAST COMPLETED rank=%d\n", rank);
  std::fflush(stdout);
  std::_Exit(2);
}
