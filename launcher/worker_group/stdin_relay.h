#pragma once
// StdinRelay: ddprun's terminal input for local rank 0 (breakpoint(),
// input()). A worker in its own process group cannot read the terminal (the
// kernel stops it with SIGTTIN), so when ddprun's stdin is a terminal the
// worker reads a pipe that ddprun fills with what is typed, while ddprun is
// in the foreground. (A stdin that is no terminal is inherited directly.)
// Not thread-safe: driven by the agent's event loop.

namespace ddp::launcher {

class StdinRelay {
 public:
  StdinRelay();  // throws ddp::Error when the pipe cannot be made
  ~StdinRelay();
  StdinRelay(const StdinRelay&) = delete;
  StdinRelay& operator=(const StdinRelay&) = delete;

  // The pipe end the worker gets as stdin (close-on-exec; the spawn dups it).
  int worker_end() const { return read_end_; }
  void close_worker_end();
  // STDIN_FILENO while there is something to relay and ddprun is in the
  // terminal's foreground (reading it from the background would stop
  // ddprun), else -1.
  int poll_fd() const;
  // Moves what was typed to the worker; at end of input (Ctrl-D) or when the
  // worker has gone, the pipe is closed and nothing more is read.
  void pump();

 private:
  int read_end_ = -1;
  int write_end_ = -1;
};

}  // namespace ddp::launcher
