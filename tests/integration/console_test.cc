// The console as under torchrun, whose workers write to its terminal and
// share its stdin: progress-bar updates ("\r") show as they are written,
// workers see a terminal when ddprun has one, and local rank 0 reads
// ddprun's stdin (breakpoint(), input()).

#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "subprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
const std::string kDdprun = DDPRUN_PATH;

// Runs ddprun with `args` on a new pseudo-terminal (its stdin, stdout and
// stderr), typing `input`; returns what the terminal showed (bounded wait).
std::string run_on_terminal(const std::vector<std::string>& args, const std::string& input) {
  std::vector<std::string> argv = {kDdprun};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    execv(c_argv[0], c_argv.data());
    _exit(127);
  }
  if (pid < 0) return "<forkpty failed>";
  if (!input.empty()) {
    ssize_t ignored = write(master, input.data(), input.size());
    (void)ignored;
  }
  std::string shown;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{master, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char buf[4096];
    ssize_t n = read(master, buf, sizeof(buf));
    if (n <= 0) break;  // EIO: ddprun and its workers closed the terminal
    shown.append(buf, static_cast<size_t>(n));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(master);
  return shown;
}

TEST(Console, WorkersSeeATerminalWhenDdprunHasOneAndRankZeroReadsWhatIsTyped) {
  const std::string shown =
      run_on_terminal({"--nproc_per_node=2", "sh", "-c",
                       "[ -t 1 ] && echo out-tty; [ -t 2 ] && echo err-tty >&2; "
                       "if [ $LOCAL_RANK = 0 ]; then read line; echo typed=$line; fi"},
                      "hello\n");
  for (const char* line : {"[rank 0] out-tty", "[rank 1] out-tty", "[rank 0] err-tty",
                           "[rank 1] err-tty", "[rank 0] typed=hello"}) {
    EXPECT_NE(shown.find(line), std::string::npos) << line << " missing from:\n" << shown;
  }
}

TEST(Console, BreakpointInRankZeroTakesCommandsFromTheTerminal) {
  const std::string shown = run_on_terminal({"--nproc_per_node=2", "/usr/bin/python3", "-c",
                                             "import os\nif os.environ['LOCAL_RANK'] == '0':\n    "
                                             "breakpoint()\nprint('after', os.environ['RANK'])"},
                                            "p 6 * 7\nc\n");
  EXPECT_NE(shown.find("[rank 0] (Pdb) 42"), std::string::npos) << shown;
  EXPECT_NE(shown.find("(Pdb) after 0"), std::string::npos) << shown;
  EXPECT_NE(shown.find("[rank 1] after 1"), std::string::npos) << shown;
}

TEST(Console, OnlyLocalRankZeroReadsAPipedStdinAndOutputIsNoTerminalThen) {
  auto r = run_process(
      {"sh", "-c",
       "printf 'hello\\n' | " + kDdprun +
           " --nproc_per_node=2 sh -c '[ -t 1 ] && echo tty; read line; echo typed=$line'"},
      {}, 30s);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank 0] typed=hello"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] typed=\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("tty"), std::string::npos) << r.out;
}

TEST(Console, ProgressBarUpdatesReachTheConsoleWhileTheWorkerRuns) {
  const std::string dir = make_temp_dir();
  Subprocess p({kDdprun, "--nproc_per_node=1", "sh", "-c",
                "printf '\\r 10%%|#'; sleep 0.3; printf '\\r 50%%|#####'; touch " + dir +
                    "/half; sleep 30; printf '\\r100%%\\n'"});
  ASSERT_TRUE(wait_until(
      [&] { return p.read_out().find("[rank 0]  50%|#####\r") != std::string::npos; }, 20s))
      << "the 50% update did not reach the console while the worker ran:\n"
      << p.read_out();
  EXPECT_NE(p.read_out().find("[rank 0]  10%|#\r"), std::string::npos) << p.read_out();
  kill(p.pid(), SIGTERM);
  p.wait(10s);
}

TEST(Console, WhenTheReaderOfTheOutputExitsTheWorkersAreStoppedAndDdprunExits141) {
  // `ddprun ... | head -n 2`: once head has exited, the workers' lines have
  // nowhere to go. torchrun's workers end on EPIPE themselves; ddprun, which
  // writes their lines, stops them and exits as a program killed by SIGPIPE.
  const std::string dir = make_temp_dir();
  auto r = run_process({"bash", "-c",
                        kDdprun + " --nproc_per_node=2 sh -c 'echo $$ >>" + dir +
                            "/pids; while :; do echo line; sleep 0.05; done' 2>" + dir +
                            "/err | head -n 2; echo \"ddprun exit ${PIPESTATUS[0]}\""},
                       {}, 30s);
  ASSERT_TRUE(r.exited) << "ddprun did not stop after its reader exited\n" << r.out << r.err;
  EXPECT_NE(r.out.find("ddprun exit 141"), std::string::npos) << r.out;
  const std::string err = read_file(dir + "/err");
  EXPECT_NE(err.find("the console was closed"), std::string::npos) << err;
  EXPECT_NE(err.find("stopped workers after SIGPIPE"), std::string::npos) << err;
  std::istringstream pids(read_file(dir + "/pids"));
  int count = 0;
  for (pid_t pid; pids >> pid; ++count) EXPECT_FALSE(process_alive(pid)) << "worker " << pid;
  EXPECT_EQ(count, 2);
}

}  // namespace
}  // namespace ddp::testing
