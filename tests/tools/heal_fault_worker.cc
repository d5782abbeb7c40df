// The reference trainer (examples/train) with faults to inject, for the
// live-recovery tests (tests/integration/heal_train_test.cc). Run it under
// ddprun --on_failure=heal:
//
//   heal_fault_worker [--kill ID@STEP]... [--kill_before_update ID@STEP]...
//                     [--kill_after_forward ID@STEP]
//                     [--stop ID@STEP] [--die_in_heal ID] [--unlink_state_memory ID]
//                     [--linger_before_reform MS] [--linger_after_reform MS]
//                     [--linger_after_settle MS]
//                     [--relaunch_delay MS] [--relaunch_model_delay MS]
//                     [--slow_before_reform MS] [--slow_after_reform MS] TRAIN_FLAGS...
//
// --kill: the rank launched as ID SIGKILLs itself after committing step
// STEP (between steps; several ranks may die at the same step). --stop: it
// SIGSTOPs itself there (alive but silent, as a hung rank is).
// --kill_before_update: it SIGKILLs itself once step STEP's gradients are
// averaged, before its optimizer update (the others have the gradients and
// may update, but cannot finish the step). --kill_after_forward: it
// SIGKILLs itself after step STEP's forward pass, and every other rank
// sleeps 1 s after that forward pass, so the death is in the past when they
// look at their peers (before their backward pass). --die_in_heal:
// it SIGKILLs itself right after its first reform, while the survivors
// exchange state. --unlink_state_memory: right after its first reform, it
// removes its state memory's file from /dev/shm (the mapping stays), so a
// member behind cannot read the state straight from there. --linger_before_reform /
// --linger_after_reform: every rank sleeps MS ms before / after its first reform (the one after the
// first failure); --linger_after_settle: after settling in that reform's group (state exchanged,
// GradSync built), before its first step. Each fault fires in a rank's first launch only
// (DDP_INCARNATION and TORCHELASTIC_RESTART_COUNT 0), so a relaunch, or a restarted group, trains
// normally; but --relaunch_delay: a relaunched process sleeps MS ms before it starts;
// --relaunch_model_delay: before it allocates its model (as a large model's allocation takes time).
// --slow_before_reform: until its first reform, and --slow_after_reform: between its first and
// second reform (the group shrunk, until it grows again), a rank of the first launch sleeps MS ms
// after each step (--slow_after_reform: any rank that trained from the first step, never one that
// joined the running job: its first reform is another's arrival), so that a node started seconds
// later still finds the job running.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/shm_names.h"
#include "ddp/ddp.h"
#include "ddp/log.h"
#include "trainer.h"

namespace {

// "ID@STEP" -> (ID, STEP); exits 2 naming the flag when malformed.
std::pair<int, std::int64_t> parse_fault(const std::string& flag, const std::string& text) {
  const auto at = text.find('@');
  char* end = nullptr;
  const long id = std::strtol(text.c_str(), &end, 10);
  if (at == std::string::npos || end != text.c_str() + at) {
    std::fprintf(stderr, "heal_fault_worker: %s %s: expected ID@STEP\n", flag.c_str(),
                 text.c_str());
    std::exit(2);
  }
  return {static_cast<int>(id), std::atoll(text.c_str() + at + 1)};
}

}  // namespace

int main(int argc, char** argv) {
  std::multimap<int, std::int64_t> kills, stops, update_kills, forward_kills;
  int die_in_heal = -1, unlink_state = -1;
  long linger_before_ms = 0, linger_ms = 0, linger_settled_ms = 0, relaunch_delay_ms = 0,
       model_delay_ms = 0, slow_ms = 0, slow_before_ms = 0;
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--kill" || arg == "--stop") && i + 1 < argc) {
      (arg == "--kill" ? kills : stops).insert(parse_fault(arg, argv[++i]));
    } else if (arg == "--kill_before_update" && i + 1 < argc) {
      update_kills.insert(parse_fault(arg, argv[++i]));
    } else if (arg == "--kill_after_forward" && i + 1 < argc) {
      forward_kills.insert(parse_fault(arg, argv[++i]));
    } else if (arg == "--die_in_heal" && i + 1 < argc) {
      die_in_heal = std::atoi(argv[++i]);
    } else if (arg == "--unlink_state_memory" && i + 1 < argc) {
      unlink_state = std::atoi(argv[++i]);
    } else if (arg == "--linger_before_reform" && i + 1 < argc) {
      linger_before_ms = std::atol(argv[++i]);
    } else if (arg == "--relaunch_model_delay" && i + 1 < argc) {
      model_delay_ms = std::atol(argv[++i]);
    } else if (arg == "--linger_after_reform" && i + 1 < argc) {
      linger_ms = std::atol(argv[++i]);
    } else if (arg == "--linger_after_settle" && i + 1 < argc) {
      linger_settled_ms = std::atol(argv[++i]);
    } else if (arg == "--slow_before_reform" && i + 1 < argc) {
      slow_before_ms = std::atol(argv[++i]);
    } else if (arg == "--slow_after_reform" && i + 1 < argc) {
      slow_ms = std::atol(argv[++i]);
    } else if (arg == "--relaunch_delay" && i + 1 < argc) {
      relaunch_delay_ms = std::atol(argv[++i]);
    } else {
      args.push_back(arg);
    }
  }
  auto zero_or_unset = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr || std::string(value) == "0";
  };
  const bool relaunched = !zero_or_unset("DDP_INCARNATION");
  const bool first_launch = !relaunched && zero_or_unset("TORCHELASTIC_RESTART_COUNT");
  if (relaunched) {
    std::this_thread::sleep_for(std::chrono::milliseconds(relaunch_delay_ms));
  }
  const int id = ddp::rank();
  auto fires = [&](const std::multimap<int, std::int64_t>& faults, std::int64_t step) {
    auto [from, to] = faults.equal_range(id);
    for (auto it = from; it != to; ++it) {
      if (it->second == step) return first_launch;
    }
    return false;
  };
  bool reformed = false;
  int reforms = 0;
  std::int64_t first_step = 0;  // the first committed count this process made
  train::Hooks hooks;
  hooks.after_step = [&](std::int64_t step) {
    if (first_step == 0) first_step = step;
    if (fires(kills, step)) {
      ddp::log::warn("--kill {}@{}: killing this rank (SIGKILL)", id, step);
      ::kill(::getpid(), SIGKILL);
    }
    if (fires(stops, step)) {
      ddp::log::warn("--stop {}@{}: stopping this rank (SIGSTOP)", id, step);
      ::kill(::getpid(), SIGSTOP);
    }
    if (first_launch && reforms == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_before_ms));
    }
    if (reforms == 1 && first_step == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
    }
  };
  hooks.before_update = [&](std::int64_t step) {
    if (fires(update_kills, step)) {
      ddp::log::warn("--kill_before_update {}@{}: killing this rank (SIGKILL)", id, step);
      ::kill(::getpid(), SIGKILL);
    }
  };
  hooks.after_forward = [&](std::int64_t step) {
    if (fires(forward_kills, step)) {
      ddp::log::warn("--kill_after_forward {}@{}: killing this rank (SIGKILL)", id, step);
      ::kill(::getpid(), SIGKILL);
    }
    for (const auto& [victim, at] : forward_kills) {
      if (at == step && victim != id && first_launch) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        break;
      }
    }
  };
  hooks.before_reform = [&] {
    if (first_launch && !reformed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(linger_before_ms));
    }
  };
  hooks.after_reform = [&] {
    if (id == die_in_heal && first_launch && !reformed) {
      ddp::log::warn("--die_in_heal {}: killing this rank during the heal (SIGKILL)", id);
      ::kill(::getpid(), SIGKILL);
    }
    if (id == unlink_state && first_launch && !reformed) {
      const char* run_id = std::getenv("DDP_RUN_ID");
      const std::string mine = ddp::shm_state_prefix(run_id ? run_id : "", ::getpid());
      for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(mine, 0) == 0) {
          ddp::log::warn("--unlink_state_memory {}: removing /dev/shm/{}", id, name);
          std::filesystem::remove(entry.path());
        }
      }
    }
    if (first_launch && !reformed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
    }
    reformed = true;
    ++reforms;
  };
  bool settled_after_reform = false;
  hooks.after_settle = [&] {
    if (first_launch && reformed && !settled_after_reform) {
      std::this_thread::sleep_for(std::chrono::milliseconds(linger_settled_ms));
      settled_after_reform = true;
    }
  };
  hooks.before_model = [&] {
    if (relaunched) std::this_thread::sleep_for(std::chrono::milliseconds(model_delay_ms));
  };
  return train::run_trainer(args, hooks);
}
