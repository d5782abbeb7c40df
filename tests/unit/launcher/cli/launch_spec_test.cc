#include "cli/launch_spec.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>
#include <fstream>

#include "cli/stream_routing.h"
#include "ddp/common/error.h"
#include "parse_launch.h"

namespace ddp::launcher {
namespace {

TEST(LaunchSpec, BothSpellingsOfEveryMultiWordFlag) {
  EXPECT_EQ(parse({"--nproc_per_node=3", "prog"}).nproc_per_node, 3);
  EXPECT_EQ(parse({"--nproc-per-node", "3", "prog"}).nproc_per_node, 3);
  EXPECT_EQ(parse({"--max-restarts=2", "prog"}).max_restarts, 2);
  EXPECT_DOUBLE_EQ(parse({"--monitor-interval=0.05", "prog"}).monitor_interval_s, 0.05);
  EXPECT_DOUBLE_EQ(parse({"--shutdown-timeout", "1.5", "prog"}).shutdown_timeout_s, 1.5);
}

TEST(LaunchSpec, DefaultsAreTorchrunLikeAndRunIdIsUnique) {
  auto a = parse({"prog"});
  auto b = parse({"prog"});
  EXPECT_EQ(a.nproc_per_node, 1);
  EXPECT_DOUBLE_EQ(a.monitor_interval_s, 0.1);
  EXPECT_EQ(a.max_restarts, 0);
  EXPECT_EQ(a.master_addr, "127.0.0.1");
  EXPECT_FALSE(a.run_id.empty());
  EXPECT_NE(a.run_id, b.run_id);
}

TEST(LaunchSpec, EverythingAfterTheProgramBelongsToIt) {
  auto spec = parse({"--nproc_per_node=2", "prog", "--nproc_per_node=9", "-m", "--", "x"});
  EXPECT_EQ(spec.nproc_per_node, 2);
  EXPECT_EQ(spec.program, "prog");
  EXPECT_EQ(spec.program_args, (std::vector<std::string>{"--nproc_per_node=9", "-m", "--", "x"}));
  EXPECT_EQ(parse({"--", "prog", "a"}).command(), (std::vector<std::string>{"prog", "a"}));
}

TEST(LaunchSpec, PythonProgramsRunUnderPython) {
  EXPECT_EQ(parse({"train.py", "--lr=1"}).command(),
            (std::vector<std::string>{"python3", "-u", "train.py", "--lr=1"}));
  EXPECT_EQ(parse({"-m", "pkg.train", "a"}).command(),
            (std::vector<std::string>{"python3", "-u", "-m", "pkg.train", "a"}));
  EXPECT_EQ(parse({"--no_python", "train.py"}).command(), (std::vector<std::string>{"train.py"}));
}

TEST(LaunchSpec, StragglerWindowIsCheckedAndNamed) {
  EXPECT_DOUBLE_EQ(parse({"prog"}).straggler_window_s, 40);
  EXPECT_DOUBLE_EQ(parse({"--straggler-window=0", "prog"}).straggler_window_s, 0);
  setenv("PET_STRAGGLER_WINDOW", "12", 1);
  const double from_env = parse({"prog"}).straggler_window_s;
  unsetenv("PET_STRAGGLER_WINDOW");
  EXPECT_DOUBLE_EQ(from_env, 12);
  EXPECT_NE(error_of({"--straggler_window=1", "prog"})
                .find("--straggler_window must be 0 (off) or in [2, 86400] seconds"),
            std::string::npos);
  EXPECT_NE(error_of({"--straggler_window=-3", "prog"}).find("--straggler_window"),
            std::string::npos);
  EXPECT_NE(error_of({"--straggler_window=10", "--status_interval=5", "prog"})
                .find("at least 4 samples (4 x --status_interval)"),
            std::string::npos);
  // The observability ranges are checked whatever TORCH_ELASTIC_SHUTDOWN_TIMEOUT says.
  EXPECT_NE(error_of({"--status_interval=-1", "prog"}).find("--status_interval must be"),
            std::string::npos);
  EXPECT_NE(error_of({"--metrics_port=70000", "prog"}).find("--metrics_port=70000"),
            std::string::npos);
}

TEST(LaunchSpec, PetEnvironmentFallbacks) {
  setenv("PET_NPROC_PER_NODE", "5", 1);
  setenv("PET_MAX_RESTARTS", "4", 1);
  auto spec = parse({"prog"});
  auto cli_wins = parse({"--nproc_per_node=2", "prog"});
  unsetenv("PET_NPROC_PER_NODE");
  unsetenv("PET_MAX_RESTARTS");
  EXPECT_EQ(spec.nproc_per_node, 5);
  EXPECT_EQ(spec.max_restarts, 4);
  EXPECT_EQ(cli_wins.nproc_per_node, 2);
}

// torchrun 2.x's one port: node rank 0's rendezvous listens on MASTER_PORT
// and serves the program's store there (TORCHELASTIC_USE_AGENT_STORE).
TEST(LaunchSpec, TorchrunStaticFormServesTheRendezvousAndTheAgentStoreOnMasterPort) {
  auto n0 = parse(
      {"--nnodes=2", "--node_rank=0", "--master_addr=10.1.2.3", "--master_port=29600", "prog"});
  EXPECT_EQ(n0.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(n0.rdzv_host, "10.1.2.3");
  EXPECT_EQ(n0.rdzv_port, 29600);
  EXPECT_EQ(n0.master_port, 29600);
  EXPECT_TRUE(n0.agent_store);
  EXPECT_TRUE(n0.hosts_rendezvous());
  EXPECT_EQ(n0.run_id, "none");  // torchrun's default: the same on every node
  EXPECT_EQ(n0.rdzv_token, "");  // no token: unauthenticated, as torchrun
  auto n1 = parse({"--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", "prog"});
  EXPECT_FALSE(n1.hosts_rendezvous());
  EXPECT_EQ(n1.master_port, 29500);  // torchrun's default port
  EXPECT_EQ(n1.rdzv_port, 29500);
  EXPECT_TRUE(n1.agent_store);
  auto v6 = parse({"--nnodes=2", "--node_rank=1", "--master_addr=fd00::1", "prog"});
  EXPECT_EQ(v6.rdzv_host, "fd00::1");
  EXPECT_EQ(v6.rdzv_endpoint, "[fd00::1]:29500");
  EXPECT_EQ(parse({"--nnodes=2", "--node_rank=1", "--master_port=65535", "prog"}).rdzv_port, 65535);
}

// TLS keeps gRPC's own acceptor, which cannot share a port: two ports, the
// program's rank 0 binding MASTER_PORT. So does a --rdzv_endpoint given.
TEST(LaunchSpec, TheStaticFormWithTlsOrAnEndpointKeepsMasterPortForTheProgram) {
  const std::string ca = ::testing::TempDir() + "/ca.pem";
  std::ofstream(ca) << "not read here\n";
  for (const std::string& tls : {"--rdzv_tls_ca=" + ca, "--rdzv_tls_cert=" + ca}) {
    std::vector<std::string> args = {"--nnodes=2", "--node_rank=1", "--master_addr=10.1.2.3", tls,
                                     "prog"};
    if (tls.find("cert") != std::string::npos) args.insert(args.end() - 1, "--rdzv_tls_key=" + ca);
    auto spec = parse(args);
    EXPECT_EQ(spec.rdzv_port, 29501) << tls;
    EXPECT_EQ(spec.master_port, 29500) << tls;
    EXPECT_FALSE(spec.agent_store) << tls;
  }
  auto given = parse({"--nnodes=2", "--node_rank=0", "--rdzv_endpoint=10.1.2.3:29400",
                      "--master_port=29500", "prog"});
  EXPECT_EQ(given.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(given.rdzv_port, 29400);
  EXPECT_FALSE(given.agent_store);
  EXPECT_FALSE(parse({"--nnodes=2", "--rdzv_endpoint=h", "prog"}).agent_store) << "the c10d form";
  EXPECT_FALSE(parse({"prog"}).agent_store) << "a single node";
}

TEST(LaunchSpec, TorchrunC10dFormAndItsDefaults) {
  auto c = parse(
      {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=head:29400", "--rdzv_id=job", "prog"});
  EXPECT_EQ(c.rdzv_backend, RdzvBackend::kC10d);
  EXPECT_EQ(c.node_rank, -1);
  EXPECT_EQ(c.run_id, "job");
  EXPECT_TRUE(c.guesses_host());
  EXPECT_FALSE(c.hosts_rendezvous());
  // No backend and no node rank, or an elastic size: c10d.
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv_endpoint=h", "prog"}).rdzv_backend, RdzvBackend::kC10d);
  EXPECT_EQ(parse({"--nnodes=1:2", "--node_rank=0", "--rdzv_endpoint=h", "prog"}).rdzv_backend,
            RdzvBackend::kC10d);
  auto host = parse({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h",
                     "--rdzv_conf=is_host=true", "prog"});
  EXPECT_TRUE(host.hosts_rendezvous());
  EXPECT_FALSE(host.guesses_host());
  auto client = parse(
      {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h", "--rdzv_conf=is_host=0", "prog"});
  EXPECT_FALSE(client.hosts_rendezvous());
  EXPECT_FALSE(client.guesses_host());
  // A single node keeps a unique id.
  EXPECT_NE(parse({"prog"}).run_id, "none");
}

TEST(LaunchSpec, RunIdComesFromRdzvIdRunIdOrTheirVariables) {
  setenv("PET_RDZV_ID", "from-rdzv-id", 1);
  auto rdzv_id = parse({"--nnodes=2", "--rdzv_endpoint=h", "prog"});
  setenv("PET_RUN_ID", "from-run-id", 1);
  auto run_id = parse({"--nnodes=2", "--rdzv_endpoint=h", "prog"});
  auto flag = parse({"--nnodes=2", "--rdzv_endpoint=h", "--rdzv-id=flag", "prog"});
  unsetenv("PET_RDZV_ID");
  unsetenv("PET_RUN_ID");
  EXPECT_EQ(rdzv_id.run_id, "from-rdzv-id");
  EXPECT_EQ(run_id.run_id, "from-run-id");
  EXPECT_EQ(flag.run_id, "flag");
}

TEST(LaunchSpec, BackendsAndStaticFormErrors) {
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=h", "p"})
                .find("--rdzv_backend=etcd is not supported"),
            std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend=zk", "p"}).find("--rdzv_backend=zk: expected static or c10d"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=static", "p"}).find("needs --node_rank"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=1:2", "--rdzv_backend=static", "--node_rank=0", "p"})
                .find("use --rdzv_backend=c10d"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--rdzv_backend=c10d", "p"}).find("needs --rdzv_endpoint"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes=2", "--node_rank=1", "--rdzv_endpoint=h:0", "p"}).find("port 0"),
            std::string::npos);
  EXPECT_NE(
      error_of({"--nnodes=2", "--node_rank=0", "--master_port=65535", "--rdzv_tls_ca=ca.pem", "p"})
          .find("--master_port=65535: the static form with TLS needs a port below 65535"),
      std::string::npos);
  EXPECT_NE(
      error_of({"--nnodes=2", "--node_rank=0", "--master_port=0", "p"}).find("--master_port=0"),
      std::string::npos);
}

TEST(LaunchSpec, TorchrunRdzvConfKeys) {
  RdzvConf c = parse_rdzv_conf(
      "join_timeout=90,keep_alive_interval=2,keep_alive_max_attempt=4,read_timeout=7,"
      "close_timeout=3,is_host=yes,last_call_timeout=1",
      TorchHandler::kC10d);
  EXPECT_DOUBLE_EQ(c.join_timeout_s, 90);
  EXPECT_DOUBLE_EQ(c.heartbeat_interval_s, 2);
  EXPECT_DOUBLE_EQ(c.heartbeat_timeout_s, 8);  // interval x attempts
  EXPECT_DOUBLE_EQ(c.read_timeout_s, 7);
  EXPECT_EQ(c.close_timeout_s, 3.0);
  EXPECT_EQ(c.is_host, true);
  EXPECT_DOUBLE_EQ(c.last_call_timeout_s, 1);
  EXPECT_EQ(parse_rdzv_conf("is_host=False", TorchHandler::kC10d).is_host, false);
  EXPECT_FALSE(parse_rdzv_conf("", TorchHandler::kC10d).is_host.has_value());
  auto error = [](const std::string& text) {
    try {
      parse_rdzv_conf(text, TorchHandler::kC10d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(error("is_host=maybe").find("is_host=maybe is not a boolean"), std::string::npos);
  EXPECT_NE(error("keep_alive_max_attempt=0").find("keep_alive_max_attempt=0"), std::string::npos);
  // A key limit below what ddprun's own keys need is refused up front.
  EXPECT_NE(error("max_key_bytes=64").find("max_key_bytes=64 is below 256"), std::string::npos);
  EXPECT_EQ(parse_rdzv_conf("max_key_bytes=256", TorchHandler::kC10d).max_key_bytes, 256);
  // Both given: heartbeat_timeout wins, and the other is named in a notice (torchrun accepts the
  // pair).
  std::vector<std::string> notices;
  EXPECT_DOUBLE_EQ(
      parse_rdzv_conf("keep_alive_max_attempt=3,heartbeat_timeout=9", TorchHandler::kC10d, &notices)
          .heartbeat_timeout_s,
      9);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("keep_alive_max_attempt has no effect"), std::string::npos)
      << notices[0];
}

TEST(LaunchSpec, TorchrunFlagsWithoutEffectGiveNotices) {
  auto spec = parse(
      {"--start-method=forkserver", "--numa-binding=node", "--log-line-prefix-template=x", "prog"});
  ASSERT_EQ(spec.notices.size(), 3u);
  EXPECT_NE(spec.notices[0].find("--start_method=forkserver has no effect"), std::string::npos);
  EXPECT_NE(spec.notices[2].find("--numa_binding=node is not implemented"), std::string::npos);
  EXPECT_TRUE(parse({"prog"}).notices.empty());
}

TEST(LaunchSpec, TokenFromAFile) {
  char path[] = "/tmp/ddprun-token-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "s3cret\n", 7), 7);
  close(fd);
  auto spec =
      parse({"--nnodes=2", "--rdzv_endpoint=h", std::string("--rdzv_token_file=") + path, "prog"});
  EXPECT_EQ(spec.rdzv_token, "s3cret");
  EXPECT_NE(error_of({"--rdzv_token=a", std::string("--rdzv_token_file=") + path, "p"})
                .find("both given"),
            std::string::npos);
  unlink(path);
  EXPECT_NE(error_of({std::string("--rdzv_token_file=") + path, "p"}).find("cannot read"),
            std::string::npos);
}

TEST(LaunchSpec, ErrorsNameTheFlag) {
  EXPECT_NE(error_of({"--bogus", "prog"}).find("unknown option '--bogus'"), std::string::npos);
  EXPECT_NE(error_of({}).find("no program given"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node=0", "p"}).find("--nproc_per_node=0"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node=-1", "p"}).find("--nproc_per_node=-1"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=3:2", "p"}).find("--nnodes=3:2"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes=0", "p"}).find("--nnodes=0"), std::string::npos);
  EXPECT_NE(error_of({"--node_rank=1", "p"}).find("--node_rank=1"), std::string::npos);
  EXPECT_NE(error_of({"--master_port=-5", "p"}).find("--master_port=-5"), std::string::npos);
  EXPECT_NE(error_of({"--shutdown_timeout=-1", "p"}).find("--shutdown_timeout"), std::string::npos);
  EXPECT_NE(error_of({"--tee=0:9", "p"}).find("--tee=0:9"), std::string::npos);
  EXPECT_NE(error_of({"--run_id=a/b", "p"}).find("--run_id=a/b"), std::string::npos);
  EXPECT_NE(error_of({"-m", "--no_python", "p"}).find("--no_python"), std::string::npos);
}

TEST(LaunchSpec, ExampleConfigsParse) {
  auto single = parse({"--config", std::string(CONFIGS_DIR) + "/single_node.toml", "prog"});
  EXPECT_EQ(single.nproc_per_node, 4);
  EXPECT_EQ(single.max_restarts, 1);
  EXPECT_EQ(single.tee.for_rank(0), kBoth);
  auto quiet = parse({"--config", std::string(CONFIGS_DIR) + "/quiet_workers.toml", "prog"});
  ASSERT_TRUE(quiet.local_ranks_filter);
  EXPECT_EQ(*quiet.local_ranks_filter, std::vector<int>{0});
}

TEST(Nproc, ResolvesAutoCpuGpu) {
  EXPECT_EQ(resolve_nproc("auto", 0, 6), 6);
  EXPECT_EQ(resolve_nproc("auto", 2, 6), 2);
  EXPECT_EQ(resolve_nproc("cpu", 2, 6), 6);
  EXPECT_EQ(resolve_nproc("gpu", 3, 6), 3);
  EXPECT_THROW(resolve_nproc("gpu", 0, 6), Error);
  EXPECT_EQ(resolve_nproc("12", 0, 1), 12);
}

TEST(StreamRouting, ParsesAllAndPerRankForms) {
  auto all = parse_stream_map("--redirects", "3");
  EXPECT_EQ(all.for_rank(0), kBoth);
  EXPECT_EQ(all.for_rank(7), kBoth);
  auto per = parse_stream_map("--tee", "0:1,2:2");
  EXPECT_EQ(per.for_rank(0), kStdout);
  EXPECT_EQ(per.for_rank(1), kNone);
  EXPECT_EQ(per.for_rank(2), kStderr);
  EXPECT_FALSE(parse_stream_map("--tee", "").any());
  EXPECT_THROW(parse_stream_map("--tee", "4"), Error);
  EXPECT_THROW(parse_stream_map("--tee", "a:1"), Error);
  EXPECT_THROW(parse_stream_map("--tee", "99999999:1"), Error);
}

}  // namespace
}  // namespace ddp::launcher
