// What a NCCL communicator does when a peer process dies, measured with
// NCCL alone (no libddp): how long after a peer's SIGKILL the survivor's
// ncclCommGetAsyncError reports it, how long ncclCommAbort then takes, and
// whether the survivor can form a new communicator with a newcomer in the
// same process. Two scenarios: the peer dies inside an all-reduce, and
// before it. libddp's live recovery rests on these (docs/heal.md).
//
//   nccl_abort_probe [--mib N] DIR
//
// Starts its ranks itself (as processes of this program) on CUDA device 0,
// each with a NCCL host id of its own (NCCL_HOSTID), so one GPU is enough
// and NCCL connects them over sockets as across machines; set
// NCCL_SOCKET_IFNAME=lo. DIR: an empty folder for the unique ids. Exit 0
// when both scenarios ended with a correct all-reduce on the new
// communicator.

#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::string g_dir;
std::size_t g_floats = std::size_t{16} << 20;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "nccl_abort_probe: %s\n", what.c_str());
  std::exit(3);
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    die(std::string(what) + ": " + ncclGetErrorString(r));
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Files in g_dir: written whole (rename), read once complete.
void put(const std::string& name, const void* data, std::size_t bytes) {
  const std::string path = g_dir + "/" + name;
  std::ofstream(path + ".tmp", std::ios::binary).write(static_cast<const char*>(data), bytes);
  std::filesystem::rename(path + ".tmp", path);
}
void take(const std::string& name, void* data, std::size_t bytes) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    std::ifstream in(g_dir + "/" + name, std::ios::binary);
    if (in.read(static_cast<char*>(data), static_cast<std::streamsize>(bytes))) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  die("no " + name + " in " + g_dir + " within 30 s");
}

pid_t spawn(const char* self, const std::string& role, const std::string& host) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("NCCL_HOSTID", host.c_str(), 1);
    const std::string mib = std::to_string(g_floats * 4 >> 20);
    ::execl(self, self, "--mib", mib.c_str(), "--role", role.c_str(), g_dir.c_str(), nullptr);
    ::_exit(127);
  }
  return pid;
}

// A non-blocking communicator of `size`, its unique id in file `id`.
ncclComm_t join(const std::string& id_file, int size, int rank) {
  ncclUniqueId id;
  if (rank == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    put(id_file, &id, sizeof id);
  } else {
    take(id_file, &id, sizeof id);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  check(ncclCommInitRankConfig(&comm, size, id, rank, &config), "ncclCommInitRankConfig");
  ncclResult_t state = ncclInProgress;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (state == ncclInProgress && Clock::now() < deadline)
    check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
  check(state, "communicator initialisation");
  return comm;
}

// Waits for the stream; "" when done, else NCCL's or CUDA's error, or "timeout".
std::string finish(ncclComm_t comm, cudaStream_t stream, double limit_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(limit_s);
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess && async == ncclSuccess) return "";
    if (async != ncclSuccess && async != ncclInProgress) return ncclGetErrorString(async);
    if (e != cudaSuccess && e != cudaErrorNotReady) return cudaGetErrorString(e);
    if (Clock::now() > deadline) return "timeout";
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void all_reduce(float* buf, ncclComm_t comm, cudaStream_t stream) {
  check(ncclAllReduce(buf, buf, g_floats, ncclFloat, ncclSum, comm, stream), "ncclAllReduce");
}

// A rank of the first communicator; rank 1 dies `when` ("inside" or "before").
int rank_main(const char* self, int rank, const std::string& when) {
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  float* buf = nullptr;
  check(cudaMalloc(&buf, g_floats * 4), "cudaMalloc");
  if (rank == 2) {  // the newcomer: a second communicator with the survivor
    ncclComm_t comm = join("id2", 2, 1);
    std::vector<float> ones(g_floats, 3.0f);
    check(cudaMemcpy(buf, ones.data(), g_floats * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    all_reduce(buf, comm, stream);
    const std::string error = finish(comm, stream, 30);
    // Leaves only once the survivor saw the all-reduce through: NCCL may
    // report this process's exit to a survivor still polling otherwise.
    int seen = 0;
    take("next-done", &seen, sizeof seen);
    ncclCommAbort(comm);
    return error.empty() ? 0 : 1;
  }
  ncclComm_t comm = join("id1", 2, rank);
  for (int i = 0; i < 10; ++i) {
    all_reduce(buf, comm, stream);
    if (const std::string e = finish(comm, stream, 30); !e.empty()) die("warm-up: " + e);
  }
  // Rank 1 dies only once rank 0 saw its warm-up through: NCCL may report
  // the death while rank 0 still waits for its last warm-up call otherwise.
  const int ready = 1;
  if (rank == 0) put("ready", &ready, sizeof ready);
  if (rank == 1) {
    int seen = 0;
    take("ready", &seen, sizeof seen);
    if (when == "inside") {
      all_reduce(buf, comm, stream);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const double t = wall_s();
    put("death", &t, sizeof t);
    ::raise(SIGKILL);
  }
  double death = 0;
  if (when == "before") take("death", &death, sizeof death);
  all_reduce(buf, comm, stream);
  const std::string error = finish(comm, stream, 20);
  if (when == "inside") take("death", &death, sizeof death);
  std::printf("peer died %s the all-reduce: survivor saw \"%s\" %.1f ms after the death\n",
              when.c_str(), error.empty() ? "no error" : error.c_str(), (wall_s() - death) * 1e3);
  const auto t0 = Clock::now();
  ncclCommAbort(comm);
  std::printf("  ncclCommAbort: %.1f ms\n", ms_since(t0));
  const pid_t newcomer = spawn(self, "newcomer", "nccl-abort-probe-c");
  const auto t1 = Clock::now();
  ncclComm_t next = join("id2", 2, 0);
  std::printf("  new communicator with a newcomer: %.1f ms\n", ms_since(t1));
  std::vector<float> values(g_floats, 1.0f);
  check(cudaMemcpy(buf, values.data(), g_floats * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  all_reduce(buf, next, stream);
  const std::string next_error = finish(next, stream, 30);
  const int done = 1;
  put("next-done", &done, sizeof done);
  check(cudaMemcpy(values.data(), buf, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::printf("  its all-reduce: %s (%.1f, expected 4.0)\n",
              next_error.empty() ? "done" : next_error.c_str(), values[0]);
  int status = 0;
  ::waitpid(newcomer, &status, 0);
  ncclCommAbort(next);
  return next_error.empty() && values[0] == 4.0f && WIFEXITED(status) && WEXITSTATUS(status) == 0
             ? 0
             : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mib" && i + 1 < argc) {
      g_floats = std::strtoull(argv[++i], nullptr, 10) << 20 >> 2;
    } else if (arg == "--role" && i + 1 < argc) {
      role = argv[++i];
    } else if (g_dir.empty() && arg[0] != '-') {
      g_dir = arg;
    } else {
      die("usage: nccl_abort_probe [--mib N] DIR");
    }
  }
  if (g_dir.empty() || g_floats == 0) die("usage: nccl_abort_probe [--mib N] DIR");
  if (role == "newcomer") return rank_main(argv[0], 2, "");
  if (role.rfind("rank", 0) == 0) {
    const auto colon = role.find(':');
    return rank_main(argv[0], role[4] - '0', role.substr(colon + 1));
  }
  int failures = 0;
  for (const std::string when : {"inside", "before"}) {
    for (const auto& f : std::filesystem::directory_iterator(g_dir)) std::filesystem::remove(f);
    const pid_t survivor = spawn(argv[0], "rank0:" + when, "nccl-abort-probe-a");
    const pid_t victim = spawn(argv[0], "rank1:" + when, "nccl-abort-probe-b");
    int status = 0;
    ::waitpid(victim, &status, 0);
    ::waitpid(survivor, &status, 0);
    std::fflush(stdout);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
  }
  return failures == 0 ? 0 : 1;
}
