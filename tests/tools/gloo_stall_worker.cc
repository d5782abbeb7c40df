// Two ranks on gloo, started by hand: rank 0 broadcasts 256 MiB; as soon as
// the first bytes have landed on rank 1 (rank 0's send under way, its socket
// full), rank 1
//   stop:  stops itself (SIGSTOP), for the test to SIGKILL it;
//   abort: leaves the group (ProcessGroup::abort) and stays alive.
//
// Prints, rank 1: "STOPPED MID-TRANSFER" or "LEFT MID-TRANSFER", or
// "TRANSFER DONE BEFORE STOP" (exit 3) when the bytes all came first (the
// test then tries again). Rank 0: "EXPECTED ERROR: ..." and "FAILED AFTER
// ms=N" (exit 0) when its broadcast fails, "BROADCAST COMPLETED" (exit 2)
// if it does not.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"

int main(int argc, char** argv) {
  const std::string how = argc > 1 ? argv[1] : "";
  if (how != "stop" && how != "abort") {
    std::fprintf(stderr, "usage: gloo_stall_worker stop|abort\n");
    return 2;
  }
  auto group = ddp::init();
  const int rank = group->rank();
  std::vector<std::uint8_t> data(std::size_t{256} << 20, rank == 0 ? 1 : 0);
  std::atomic<bool> over{false};
  std::thread receiver;
  if (rank == 1) {
    receiver = std::thread([&] {
      const volatile std::uint8_t* bytes = data.data();  // written by Gloo's thread
      while (bytes[0] == 0 && !over.load()) {
      }
      if (over.load() || bytes[data.size() - 1] != 0) {
        std::printf("TRANSFER DONE BEFORE STOP\n");
        std::fflush(stdout);
        std::_Exit(3);
      }
      if (how == "abort") {
        group->abort();
        std::printf("LEFT MID-TRANSFER\n");
        std::fflush(stdout);
        return;
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
    if (rank == 1) pause();         // alive, having left: the test kills it
    std::_Exit(rank == 0 ? 0 : 1);  // the group is broken: do not wait on it at exit
  }
  over = true;
  if (receiver.joinable()) receiver.join();
  std::printf("BROADCAST COMPLETED rank=%d\n", rank);
  std::fflush(stdout);
  std::_Exit(2);
}
