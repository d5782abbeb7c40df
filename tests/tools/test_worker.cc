// A worker for the launcher's integration tests. The first argument picks
// what it does; see usage() below. It reads the contract through the one
// parser in common/ where it needs ranks.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ddp/common/env_contract.h"
#include "ddp/common/rendezvous_client.h"
#include "ddp/common/shm_names.h"
#include "tcp_barrier.h"

namespace {

int usage() {
  std::fprintf(
      stderr,
      "usage: test_worker MODE ...\n"
      "  env                       print the contract variables and OMP_NUM_THREADS\n"
      "  args A...                 print each argument as 'ARG <a>'\n"
      "  exit CODE                 exit with CODE\n"
      "  fail RANK CODE            RANK writes to stderr and exits CODE; others wait\n"
      "  signal RANK SIG           RANK kills itself with SIG; others wait\n"
      "  hold DIR [ignore-term]    write DIR/pid_<rank>, fork a child writing DIR/child_<rank>, "
      "wait\n"
      "  on-usr1 DIR               fork a child (default SIGUSR1 action), write DIR/pid_<rank>,\n"
      "                            wait for SIGUSR1, print 'rank R got SIGUSR1, child "
      "alive|dead',\n"
      "                            end the child, exit 0 (a checkpoint before preemption)\n"
      "  binary                    write bytes 0..255 and a line without newline\n"
      "  fail-until ATTEMPT        exit 1 while TORCHELASTIC_RESTART_COUNT < ATTEMPT\n"
      "  barrier                   pass a TCP barrier on MASTER_ADDR:MASTER_PORT\n"
      "  rdzv                      store round trips and barriers through DDP_RDZV_ENDPOINT\n"
      "  rdzv-at-size N            hold while GROUP_WORLD_SIZE < N, then rdzv\n"
      "  rdzv-at-restart N         hold while TORCHELASTIC_RESTART_COUNT < N, then rdzv\n"
      "  shm-leak HOW [DIR]        create a 1 MiB shm segment named as libddp does, print\n"
      "                            'SHM STALE <n>' (segments of this run from other rounds)\n"
      "                            and 'SHM <name>', write DIR/pid_<rank>, then HOW:\n"
      "                            exit (code 3), kill (SIGKILL itself), hold (wait),\n"
      "                            kill-first (SIGKILL itself in attempt 0, exit 0 later)\n");
  return 64;
}

void write_pid_file(const std::string& path, pid_t pid) {
  std::ofstream tmp(path + ".tmp");
  tmp << pid << "\n";
  tmp.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

[[noreturn]] void wait_forever() {
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string mode = argv[1];
  auto env = ddp::WorkerEnv::from_process_env();
  int rank = env ? env->rank : 0;

  if (mode == "env") {
    for (const auto& name : ddp::contract_variable_names()) {
      const char* v = std::getenv(name.c_str());
      if (v) std::printf("ENV %s=%s\n", name.c_str(), v);
    }
    const char* omp = std::getenv("OMP_NUM_THREADS");
    std::printf("ENV OMP_NUM_THREADS=%s\n", omp ? omp : "<unset>");
    return 0;
  }
  if (mode == "args") {
    for (int i = 2; i < argc; ++i) std::printf("ARG %s\n", argv[i]);
    return 0;
  }
  if (mode == "exit" && argc == 3) return std::atoi(argv[2]);
  if ((mode == "fail" || mode == "signal") && argc == 4) {
    if (rank == std::atoi(argv[2])) {
      std::fprintf(stderr, "rank %d: first line of trouble\n", rank);
      std::fprintf(stderr, "rank %d: about to fail\n", rank);
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the others start
      if (mode == "fail") return std::atoi(argv[3]);
      signal(std::atoi(argv[3]), SIG_DFL);
      raise(std::atoi(argv[3]));
      return 99;
    }
    wait_forever();
  }
  if (mode == "hold" && argc >= 3) {
    std::string dir = argv[2];
    bool ignore_term = argc >= 4 && std::string(argv[3]) == "ignore-term";
    if (ignore_term) signal(SIGTERM, SIG_IGN);
    pid_t child = fork();
    if (child == 0) {
      // A grandchild of ddprun: no PDEATHSIG of its own, ignores SIGTERM.
      signal(SIGTERM, SIG_IGN);
      write_pid_file(dir + "/child_" + std::to_string(rank), getpid());
      wait_forever();
    }
    write_pid_file(dir + "/pid_" + std::to_string(rank), getpid());
    std::printf("holding\n");
    std::fflush(stdout);
    wait_forever();
  }
  if (mode == "on-usr1" && argc == 3) {
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pid_t child = fork();
    if (child == 0) wait_forever();  // SIGUSR1 would kill it
    sigprocmask(SIG_BLOCK, &usr1, nullptr);
    write_pid_file(std::string(argv[2]) + "/pid_" + std::to_string(rank), getpid());
    int sig = 0;
    sigwait(&usr1, &sig);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(50));  // a child's death would show by now
    const bool alive = kill(child, 0) == 0 && waitpid(child, nullptr, WNOHANG) == 0;
    std::printf("rank %d got SIGUSR1, child %s\n", rank, alive ? "alive" : "dead");
    std::fflush(stdout);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return 0;
  }
  if (mode == "binary") {
    std::string bytes;
    for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
    bytes += "\ntail-without-newline";
    fwrite(bytes.data(), 1, bytes.size(), stdout);
    return 0;
  }
  if (mode == "fail-until" && argc == 3) {
    int attempt = env ? env->restart_count : 0;
    std::printf("attempt %d\n", attempt);
    return attempt < std::atoi(argv[2]) ? 1 : 0;
  }
  if (mode == "barrier") {
    if (!env) return 3;
    ddp::testing::tcp_barrier(*env, 20000);
    std::printf("barrier passed\n");
    return 0;
  }
  // Holds (like a long training step) until the job has grown to N nodes, or
  // has been restarted N times; then does what "rdzv" does.
  if ((mode == "rdzv-at-size" || mode == "rdzv-at-restart") && argc == 3 && env) {
    const int n = std::atoi(argv[2]);
    const int have = mode == "rdzv-at-size" ? env->group_world_size : env->restart_count;
    if (have < n) {
      std::printf("holding in round %ld (nodes=%d restart=%d)\n", env->round, env->group_world_size,
                  env->restart_count);
      std::fflush(stdout);
      wait_forever();
    }
    mode = "rdzv";
  }
  if (mode == "rdzv") {
    if (!env || env->rdzv_endpoint.empty()) {
      std::fprintf(stderr, "rdzv: not launched with a rendezvous\n");
      return 3;
    }
    try {
      using namespace std::chrono_literals;
      ddp::RendezvousClient client(env->rdzv_endpoint, env->run_id, env->rdzv_token,
                                   ddp::TlsFiles{"", "", env->rdzv_tls_ca});
      std::string prefix = "test/round" + std::to_string(env->round) + "/";
      client.set(prefix + "rank/" + std::to_string(env->rank),
                 "value-of-" + std::to_string(env->rank));
      client.add(prefix + "count", 1);
      client.barrier(prefix + "after-set", env->rank, env->world_size, 20s);
      for (int r = 0; r < env->world_size; ++r) {
        std::string got = client.get(prefix + "rank/" + std::to_string(r), 5s);
        if (got != "value-of-" + std::to_string(r)) {
          std::fprintf(stderr, "rdzv: rank %d read '%s' for rank %d\n", env->rank, got.c_str(), r);
          return 4;
        }
      }
      std::int64_t count = client.add(prefix + "count", 0);
      if (count != env->world_size) {
        std::fprintf(stderr, "rdzv: counter is %lld, expected %d\n", static_cast<long long>(count),
                     env->world_size);
        return 5;
      }
      client.barrier(prefix + "end", env->rank, env->world_size, 20s);
      std::printf("RDZV OK rank=%d world=%d group=%d round=%ld restart=%d\n", env->rank,
                  env->world_size, env->group_rank, env->round, env->restart_count);
      return 0;
    } catch (const ddp::Error& e) {
      std::fprintf(stderr, "rdzv: %s\n", e.what());
      return 6;
    }
  }
  if (mode == "shm-leak" && argc >= 3) {
    std::string how = argv[2];
    if (!env) return 3;
    // Segments of this run left from other rounds (the launcher should have removed them).
    const std::string prefix = ddp::shm_run_prefix(env->run_id);
    const std::string this_round = prefix + "r" + std::to_string(env->round) + "-";
    int stale = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && name.rfind(this_round, 0) != 0) ++stale;
    }
    std::printf("SHM STALE %d\n", stale);
    // Created the way libddp's shm backend creates its segments.
    std::string name = ddp::shm_segment_name(env->run_id, env->round, "default", env->group_rank,
                                             getpid(), "leak" + std::to_string(env->rank));
    int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, 1 << 20) != 0) {
      std::fprintf(stderr, "shm-leak: %s: %s\n", name.c_str(), std::strerror(errno));
      return 4;
    }
    std::printf("SHM %s\n", name.c_str());
    std::fflush(stdout);
    if (argc >= 4) write_pid_file(std::string(argv[3]) + "/pid_" + std::to_string(rank), getpid());
    if (how == "hold") wait_forever();
    if (how == "exit") return 3;
    if (how == "kill" || (how == "kill-first" && env->restart_count == 0)) {
      raise(SIGKILL);
      return 99;
    }
    if (how == "kill-first") return 0;
    return usage();
  }
  return usage();
}
