#pragma once
// `ddprun --hostfile FILE` / `ddprun -H a:4,b:4`: this ddprun becomes the
// front end. It starts one ddprun agent per host over ssh (the c10d
// rendezvous on the first host, which picks a free port), in two steps: every
// host first answers that its agent is ready (ssh worked, the directory
// exists, the command line parses), within --ssh_timeout, and only then are
// they all told to go, so a host that cannot be reached fails the launch
// before any worker starts anywhere. It then streams every host's lines to
// this console (whole lines; the agents' own lines labelled with their host),
// stops every host on SIGINT/SIGTERM (each agent stops exactly its own
// workers), and exits with the code of the first failed rank, naming its
// host. Each agent also stops its workers when its ssh channel closes (the
// front end died or the link broke): see remote_gate.h.

#include "cli/hostfile_args.h"

namespace ddp::launcher {

// Runs the job; returns the front end's exit code. Throws ddp::Error for bad
// input found before anything is started (the caller exits 2).
int run_front_end(const FrontEndArgs& args, int signal_fd);

}  // namespace ddp::launcher
