#pragma once
// A standalone `ddprun rendezvous` (token "t", one node) for ranks a test
// starts by hand, without a launcher: they find it through
// DDP_RDZV_ENDPOINT.

#include <string>

#include "subprocess.h"

namespace ddp::testing {

struct StandaloneStore {
  Subprocess daemon;
  std::string endpoint;  // host:port; empty when it did not come up within 10 s

  StandaloneStore(const std::string& ddprun, const std::string& run_id)
      : daemon({ddprun, "rendezvous", "--port=0", "--host=127.0.0.1", "--run_id=" + run_id,
                "--nnodes=1"},
               {{"DDP_RDZV_TOKEN", "t"}}) {
    using namespace std::chrono_literals;
    if (!wait_until([&] { return daemon.read_out().find("listening on ") != std::string::npos; },
                    10s))
      return;
    const std::string out = daemon.read_out();
    const auto at = out.find("listening on ") + 13;
    endpoint = out.substr(at, out.find('\n', at) - at);
  }
};

}  // namespace ddp::testing
