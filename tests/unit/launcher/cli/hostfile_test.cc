// The pure parts of `ddprun --hostfile`: hostfiles (DeepSpeed's and Open
// MPI's), -H lists, --include/--exclude, .ddp_env and --env, the front end's
// command line, each host's remote command and ssh argv, and the protocol,
// line splitting, report catching and exit code of the front end.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <map>

#include "cli/hostfile.h"
#include "cli/hostfile_args.h"
#include "cli/job_env.h"
#include "cli/remote_command.h"
#include "ddp/common/error.h"
#include "error_of.h"
#include "frontend/host_stream.h"

namespace ddp::launcher {
namespace {

using ddp::testing::error_of;

std::string names(const std::vector<HostSlots>& hosts) {
  std::string text;
  for (const auto& h : hosts) {
    text += (text.empty() ? "" : " ") + h.name + ":" + std::to_string(h.workers());
    if (!h.devices.empty()) {
      text += "[";
      for (size_t i = 0; i < h.devices.size(); ++i)
        text += (i ? "," : "") + std::to_string(h.devices[i]);
      text += "]";
    }
  }
  return text;
}

TEST(Hostfile, DeepSpeedAndOpenMpiSpellings) {
  const auto hosts = parse_hostfile(
      "# cluster\n\nworker-0 slots=4\n  worker-1 slots=2 max_slots=8  # comment\nw2:3\nbob@w3\n",
      "hosts");
  EXPECT_EQ(names(hosts), "worker-0:4 worker-1:2 w2:3 bob@w3:1");
  EXPECT_EQ(hosts[1].line, 4);
  EXPECT_EQ(names(parse_host_list("a:4,b:2,c")), "a:4 b:2 c:1");
}

TEST(Hostfile, Ipv6LiteralsBareOrInBrackets) {
  // ssh takes the address bare: the brackets only set a slot count apart.
  const auto hosts = parse_hostfile(
      "fd00::2 slots=4\n[fd00::3]:2\n[fd00::4]\nbob@[fd00::5]:3\nfd00::6\n", "hosts");
  EXPECT_EQ(names(hosts), "fd00::2:4 fd00::3:2 fd00::4:1 bob@fd00::5:3 fd00::6:1");
  EXPECT_EQ(names(parse_host_list("[fd00::2]:4,[::1]")), "fd00::2:4 ::1:1");
  EXPECT_EQ(names(select_hosts(hosts, "[fd00::3]:1@fd00::6", "", "hosts")),
            "fd00::3:1[1] fd00::6:1");
  // The rendezvous on the first host: an endpoint in brackets.
  FrontEndArgs args;
  args.program = {"train"};
  const auto argv = agent_args(args, hosts, 1, "run", 10);
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--rdzv_endpoint=[fd00::2]:29400"), argv.end());
  auto bad = [](const std::string& text) { return error_of([&] { parse_hostfile(text, "hf"); }); };
  EXPECT_EQ(bad("[fd00::2 slots=1\n"), "hf:1: host '[fd00::2' has '[' without ']'");
  EXPECT_EQ(bad("[fd00::2]x\n"), "hf:1: 'x' follows host 'fd00::2'");
  EXPECT_EQ(bad("[node1]:2\n"), "hf:1: '[node1]' is not an IPv6 address");
  EXPECT_EQ(bad("fd00::zz slots=1\n"),
            "hf:1: 'fd00::zz slots=1' is not a host entry (host 'fd00::zz' is not an IPv6 "
            "address); expected 'HOST [slots=N]' or 'HOST:N' ('[IPV6]:N' for an IPv6 address with "
            "slots)");
  EXPECT_EQ(bad("[fd00::2]:\n"), "hf:1: slots '' is not a number");
}

TEST(Hostfile, BadLinesNameTheFileAndLine) {
  auto bad = [](const std::string& text) {
    return error_of([&] { parse_hostfile(text, "/x/hosts"); });
  };
  EXPECT_EQ(bad("a slots=1\nb slots=0\n"),
            "/x/hosts:2: host 'b' has 0 slots (at least 1 is needed)");
  EXPECT_EQ(bad("a slots=1\n\na:2\n"), "/x/hosts:3: host 'a' is listed twice (first on line 1)");
  EXPECT_EQ(bad("a slot=1\n"),
            "/x/hosts:1: 'slot=1' is not slots=N (expected 'HOST slots=N' or 'HOST:N')");
  EXPECT_EQ(bad("a slots=-1\n"), "/x/hosts:1: slots '-1' is not a number");
  EXPECT_EQ(bad("a:\n"), "/x/hosts:1: slots '' is not a number");
  EXPECT_EQ(bad("-oProxyCommand=x slots=1\n"),
            "/x/hosts:1: '-oProxyCommand=x slots=1' is not a host entry (host '-oProxyCommand=x' "
            "starts with '-'); expected 'HOST [slots=N]' or 'HOST:N' ('[IPV6]:N' for an IPv6 "
            "address with slots)");
  EXPECT_EQ(bad("a;rm slots=1\n"),
            "/x/hosts:1: 'a;rm slots=1' is not a host entry (host 'a;rm' contains ';'); expected "
            "'HOST [slots=N]' or 'HOST:N' ('[IPV6]:N' for an IPv6 address with slots)");
  // A file that is no hostfile at all (/etc/passwd given by mistake): the
  // line is named as no host entry, with the forms that are.
  EXPECT_EQ(bad("root:x:0:0:root:/root:/bin/bash\n"),
            "/x/hosts:1: 'root:x:0:0:root:/root:/bin/bash' is not a host entry (host "
            "'root:x:0:0:root:/root:/bin/bash' is not an IPv6 address); expected 'HOST [slots=N]' "
            "or 'HOST:N' ('[IPV6]:N' for an IPv6 address with slots)");
  EXPECT_EQ(bad("# nothing\n"), "/x/hosts: no hosts (expected lines 'HOST slots=N')");
  EXPECT_EQ(error_of([] { parse_host_list("a:2,a:1"); }),
            "--hosts=a:2,a:1: host 'a' is listed twice");
}

TEST(Hostfile, IncludeAndExcludeAsDeepSpeed) {
  const auto hosts = parse_hostfile("a slots=4\nb slots=4\nc slots=2\n", "hf");
  EXPECT_EQ(names(select_hosts(hosts, "", "", "hf")), "a:4 b:4 c:2");
  EXPECT_EQ(names(select_hosts(hosts, "a@c:1", "", "hf")), "a:4 c:1[1]");
  EXPECT_EQ(names(select_hosts(hosts, "b:0,2", "", "hf")), "b:2[0,2]");
  EXPECT_EQ(names(select_hosts(hosts, "", "b", "hf")), "a:4 c:2");
  EXPECT_EQ(names(select_hosts(hosts, "", "a:0,1@c:0,1", "hf")), "a:2[2,3] b:4");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, "a@d", "", "hf"); }),
            "--include=a@d: host 'd' is not in hf");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, "", "c:2", "hf"); }),
            "--exclude=c:2: host 'c' has 2 slot(s) in hf (indices 0-1)");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, "a", "b", "hf"); }),
            "--include and --exclude cannot be combined");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, "", "a@b@c", "hf"); }),
            "--exclude=a@b@c leaves no host of hf");
  EXPECT_EQ(error_of([&] { select_hosts(hosts, "a:x", "", "hf"); }),
            "--include=a:x: 'x' is not a slot index");
}

std::optional<std::string> lookup(const std::string& name) {
  static const std::map<std::string, std::string> env = {
      {"PATH", "/usr/bin:/bin"}, {"HOME", "/h"}, {"PYTHON_EXEC", "/py"}};
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

TEST(JobEnv, FilesThenFlagsThenPathAndPython) {
  const EnvList home = parse_env_file("A=home\nB=home\n", "~/.ddp_env");
  const EnvList work = parse_env_file("# c\n\nexport B=work=dir\r\nC= spaced \n", "./.ddp_env");
  const EnvList env = job_environment({home, work}, {"C=flag", "HOME"}, lookup);
  const EnvList expected = {{"A", "home"},  {"B", "work=dir"},         {"C", "flag"},
                            {"HOME", "/h"}, {"PATH", "/usr/bin:/bin"}, {"PYTHON_EXEC", "/py"}};
  EXPECT_EQ(env, expected);
  // A PATH given by the user is kept.
  EXPECT_EQ(job_environment({}, {"PATH=/opt"}, lookup).front().second, "/opt");
  EXPECT_EQ(error_of([] { parse_env_file("A=1\nnope\n", "/w/.ddp_env"); }),
            "/w/.ddp_env:2: 'nope' is not NAME=VALUE");
  EXPECT_EQ(error_of([] { parse_env_file("1A=1\n", "f"); }), "f:1: '1A' is not a variable name");
  EXPECT_EQ(error_of([] { job_environment({}, {"UNSET_HERE"}, lookup); }),
            "--env UNSET_HERE: UNSET_HERE is not set here (give NAME=VALUE)");
}

TEST(RemoteCommand, QuotedForAPosixShell) {
  EXPECT_EQ(shell_quote("plain/path-1.0"), "plain/path-1.0");
  EXPECT_EQ(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
  EXPECT_EQ(shell_quote(""), "''");
  RemoteJob job{"/w d", {{"A", "x y"}}, "/opt/ddprun", {"--nnodes=2", "--", "prog", "a b"}};
  EXPECT_EQ(remote_command(job),
            "cd -- '/w d' 2>/dev/null || { printf '%s\\n' '[ddprun] error: the working "
            "directory /w d does not exist on this host (ddprun --hostfile runs every host in the "
            "front end'\\''s directory)' >&2; exit 2; }; exec env 'A=x y' /opt/ddprun --nnodes=2 "
            "-- prog 'a b'");
  EXPECT_EQ(split_words("-F 'my cfg' -o \"A=b c\" x\\ y", "--ssh_opts"),
            (std::vector<std::string>{"-F", "my cfg", "-o", "A=b c", "x y"}));
  EXPECT_EQ(error_of([] { split_words("-F 'x", "--ssh_opts"); }),
            "--ssh_opts=-F 'x: a quote is not closed");
  SshSettings ssh{2222, {"-F", "cfg"}, 2.5};
  EXPECT_EQ(ssh_argv("u@h", ssh, "cmd"),
            (std::vector<std::string>{"ssh", "-p", "2222", "-F", "cfg", "-T", "-o", "BatchMode=yes",
                                      "-o", "ConnectTimeout=3", "-o", "ServerAliveInterval=5", "-o",
                                      "ServerAliveCountMax=3", "--", "u@h", "cmd"}));
}

TEST(FrontEndArgs, SplitsTheFrontEndsFlagsFromTheAgentsAndTheProgram) {
  EXPECT_FALSE(parse_front_end_args({"ddprun", "--nproc_per_node=2", "prog"}));
  auto args =
      parse_front_end_args({"ddprun", "--hostf", "hf", "--max_restarts", "1", "--env", "A=1",
                            "--env", "B", "--ssh_opts=-F c", "--rdzv_conf",
                            "is_host=1,join_timeout=5", "--run_id=j", "prog", "--env", "x"});
  ASSERT_TRUE(args);
  EXPECT_EQ(args->text.hostfile, "hf");
  EXPECT_EQ(args->text.env, (std::vector<std::string>{"A=1", "B"}));
  EXPECT_EQ(args->text.ssh_opts, "-F c");
  EXPECT_EQ(args->forwarded, (std::vector<std::string>{"--max_restarts", "1"}));
  EXPECT_EQ(args->program, (std::vector<std::string>{"prog", "--env", "x"}));
  EXPECT_EQ(args->rdzv_conf, "join_timeout=5");
  EXPECT_EQ(args->run_id, "j");
  EXPECT_EQ(args->nproc, "");
  const auto hosts = parse_host_list("u@a:2,b:1");
  EXPECT_EQ(agent_args(*args, hosts, 0, "j", 20),
            (std::vector<std::string>{"--remote_agent=20", "--nnodes=2", "--nproc_per_node=2",
                                      "--rdzv_backend=c10d", "--rdzv_endpoint=a:29400",
                                      "--rdzv_id=j", "--rdzv_conf=join_timeout=5,is_host=1",
                                      "--max_restarts", "1", "--", "prog", "--env", "x"}));
  EXPECT_EQ(agent_args(*args, hosts, 1, "j", 20)[2], "--nproc_per_node=1");
  EXPECT_EQ(agent_args(*args, hosts, 1, "j", 20)[6], "--rdzv_conf=join_timeout=5,is_host=0");
  // A flag takes no value: the program follows it.
  auto flag = parse_front_end_args({"ddprun", "-H", "a:4", "--no_prefix", "--no_python", "p", "x"});
  ASSERT_TRUE(flag);
  EXPECT_EQ(flag->forwarded, (std::vector<std::string>{"--no_prefix", "--no_python"}));
  EXPECT_EQ(flag->program, (std::vector<std::string>{"p", "x"}));
  auto given = parse_front_end_args({"ddprun", "-H", "a:4", "--nproc_per_node", "2", "--", "p"});
  ASSERT_TRUE(given);
  EXPECT_EQ(given->nproc, "2");
  EXPECT_EQ(given->program, (std::vector<std::string>{"p"}));
  EXPECT_EQ(error_of([] {
              parse_front_end_args({"ddprun", "-H", "a:1", "--node_rank=1", "p"});
            }),
            "--node_rank cannot be combined with --hosts: the front end starts one agent per host "
            "and sets it for each");
  EXPECT_EQ(error_of([] {
              parse_front_end_args({"ddprun", "--include", "a", "p"});
            }),
            "--include needs --hostfile or --hosts");
  EXPECT_EQ(error_of([] {
              parse_front_end_args({"ddprun", "-H", "a:1"});
            }),
            "no program given: usage: ddprun --hostfile FILE [OPTIONS] PROGRAM [ARGS...]");
}

// --nnodes=MIN:N: the agents get it as given, so the rendezvous goes on while
// MIN hosts remain; any range but N or MIN:N (N hosts) is refused by name.
TEST(FrontEndArgs, NnodesIsTheHostCountOrAMinimumOfIt) {
  auto args = parse_front_end_args({"ddprun", "-H", "a:2,b:2,c:2", "--nnodes=2:3", "p"});
  ASSERT_TRUE(args);
  EXPECT_EQ(args->nnodes, "2:3");
  EXPECT_TRUE(args->forwarded.empty());
  const auto hosts = parse_host_list("a:2,b:2,c:2");
  EXPECT_EQ(agent_args(*args, hosts, 2, "j", 20)[1], "--nnodes=2:3");
  auto fixed = parse_front_end_args({"ddprun", "-H", "a:2,b:2,c:2", "p"});
  ASSERT_TRUE(fixed);
  EXPECT_EQ(agent_args(*fixed, hosts, 0, "j", 20)[1], "--nnodes=3");

  EXPECT_EQ(hostfile_node_range("", 3, "hf").min, 3);
  EXPECT_EQ(hostfile_node_range("3", 3, "hf").min, 3);
  const NodeRange range = hostfile_node_range("1:3", 3, "hf");
  EXPECT_EQ(range.min, 1);
  EXPECT_EQ(range.max, 3);
  EXPECT_EQ(error_of([] { hostfile_node_range("2:4", 3, "hosts.txt"); }),
            "--nnodes=2:4 does not fit the 3 host(s) of hosts.txt: with --hostfile or --hosts it "
            "is 3, or MIN:3 for a job that goes on while MIN hosts remain");
  EXPECT_EQ(error_of([] { hostfile_node_range("2", 3, "--hosts"); }),
            "--nnodes=2 does not fit the 3 host(s) of --hosts: with --hostfile or --hosts it is 3, "
            "or MIN:3 for a job that goes on while MIN hosts remain");
  EXPECT_EQ(error_of([] {
              parse_front_end_args({"ddprun", "-H", "a:1", "--nnodes=3:2", "p"});
            }),
            "--nnodes=3:2: MIN is larger than MAX");
}

TEST(HostStream, ProtocolLines) {
  EXPECT_EQ(ready_line(0), "ddprun-ready\n");
  EXPECT_EQ(parse_ready("ddprun-ready"), 0);
  EXPECT_EQ(parse_ready("ddprun-ready port=41234"), 41234);
  EXPECT_FALSE(parse_ready("ddprun-ready port=0"));
  EXPECT_FALSE(parse_ready("[rank 0] ddprun-ready"));
  auto go = parse_go("go node1:41234 abc");
  ASSERT_TRUE(go);
  EXPECT_EQ(go->first, "node1:41234");
  EXPECT_EQ(go->second, "abc");
  EXPECT_FALSE(parse_go("go node1:1"));
  EXPECT_EQ(parse_signal("signal 2"), SIGINT);
  EXPECT_EQ(signal_line(SIGUSR1), "signal " + std::to_string(SIGUSR1) + "\n");
  EXPECT_EQ(parse_signal("signal " + std::to_string(SIGUSR1)), SIGUSR1);
  EXPECT_FALSE(parse_signal("signal 9"));  // never SIGKILL: an agent stops its workers itself
}

TEST(HostStream, WholeLinesAndLabels) {
  LineBuffer buffer;
  EXPECT_TRUE(buffer.add("[rank 0] par", 12).empty());
  EXPECT_EQ(buffer.add("t\n[rank 1] x\n[ra", 16),
            (std::vector<std::string>{"[rank 0] part", "[rank 1] x"}));
  EXPECT_EQ(buffer.finish(), "[ra");
  EXPECT_FALSE(buffer.finish());
  EXPECT_EQ(label_line("[ddprun] round 1: 2 node(s)", "n1"), "[ddprun n1] round 1: 2 node(s)");
  EXPECT_EQ(label_line("[rank 3] hello", "n1"), "[rank 3] hello");
}

TEST(HostStream, TheFirstReportDecidesTheExitCode) {
  ReportCatcher catcher;
  EXPECT_FALSE(catcher.add("[ddprun] round 1: 2 node(s)"));
  EXPECT_TRUE(
      catcher.add("[ddprun] worker failed: rank 3 (local rank 1, pid 9) ended with exit code 7"));
  EXPECT_FALSE(catcher.add("  last 1 line(s) of rank 3's stderr:"));
  EXPECT_FALSE(catcher.add("  | boom"));
  EXPECT_FALSE(catcher.add("[ddprun] stopped"));
  EXPECT_FALSE(catcher.add("  | not part of it"));
  EXPECT_EQ(catcher.report().size(), 3u);

  std::vector<HostEnd> ends(3);
  ends[0] = {"a", 1, 2, -1, {}};
  ends[1] = {"b", 7, 0, 0, catcher.report()};
  ends[2] = {"c", 0, 1, -1, {}};
  Verdict v = decide(ends, 0);
  EXPECT_EQ(v.code, 7);
  EXPECT_EQ(v.summary.front(),
            "job failed; the first failure was on host b: worker failed: rank 3 (local rank 1, pid "
            "9) ended with exit code 7");
  EXPECT_EQ(v.summary.back(), "  | boom");
  EXPECT_EQ(decide(ends, SIGINT).code, 130);
  ends[1] = {"b", 255, 0, -1, {}};
  EXPECT_EQ(decide(ends, 0).code, 255);
  EXPECT_EQ(decide(ends, 0).summary.front(),
            "job failed: the ssh connection to host b failed or was lost (ssh exit code 255)");
  for (auto& e : ends) e.code = 0;
  EXPECT_EQ(decide(ends, 0).code, 0);
}

// --nnodes=2:3: a host lost on the way (ssh 255, or its agent left out)
// does not fail a job the others finished; fewer than 2 finishing does.
TEST(HostStream, AJobOfAtLeastMinHostsFinishesWithoutTheLostOnes) {
  std::vector<HostEnd> ends(3);
  ends[0] = {"a", 0, -1, -1, {}};
  ends[1] = {"b", 0, -1, -1, {}};
  ends[2] = {"c", 255, 0, -1, {}};
  EXPECT_TRUE(job_can_go_on(ends, 2));
  EXPECT_FALSE(job_can_go_on(ends, 3));
  ends[0].ended_at = 1;
  ends[1].ended_at = 2;
  Verdict v = decide(ends, 0, 2);
  EXPECT_EQ(v.code, 0);
  ASSERT_EQ(v.summary.size(), 1u);
  EXPECT_EQ(v.summary.front(),
            "the job finished on 2 of 3 hosts without host c: the ssh connection to host c failed "
            "or was lost (ssh exit code 255)");
  EXPECT_EQ(decide(ends, 0).code, 255);  // every host was needed
  EXPECT_EQ(decide(ends, 0, 3).code, 255);
  EXPECT_EQ(decide(ends, SIGTERM, 2).code, 128 + SIGTERM);
  ends[1].code = 1;  // b failed too: one host finished, two were needed
  EXPECT_FALSE(job_can_go_on(ends, 2));
  v = decide(ends, 0, 2);
  EXPECT_EQ(v.code, 255);
  EXPECT_EQ(v.summary.front(),
            "job failed: the ssh connection to host c failed or was lost (ssh exit code 255)");
}

}  // namespace
}  // namespace ddp::launcher
