#pragma once
// Waiting for a child to exit while leaving it unreaped (a zombie), for tests
// of what counts a zombie as gone.

#include <sys/types.h>
#include <sys/wait.h>

#include <cerrno>

namespace ddp::testing {

// Blocks until `child` (a child of this process) has exited, leaving it a
// zombie; false when waitid fails (not a child of this process). Retries only
// on EINTR.
inline bool wait_until_zombie(pid_t child) {
  siginfo_t info{};
  int done;
  do {
    done = waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT);
  } while (done != 0 && errno == EINTR);
  return done == 0;
}

}  // namespace ddp::testing
