// --rdzv_conf against torch 2.x's rendezvous handlers: which handler torchrun
// gives a command line, and for each key whether it applies there. torchrun's
// own spellings (timeout, keep_alive_interval, keep_alive_max_attempt,
// is_host) apply exactly where torch's handler reads them and elsewhere give
// a notice, as do the keys ddprun has no use for; ddprun's keys apply in
// every form.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/launch_spec.h"
#include "cli/rdzv_conf.h"
#include "ddp/common/error.h"
#include "parse_launch.h"

namespace ddp::launcher {
namespace {

// The forms a command line can take, as argv before the program.
const std::vector<std::string> kStaticNodes = {"--nnodes=2", "--node_rank=1", "--master_addr=h",
                                               "--master_port=29500"};
const std::vector<std::string> kStaticOneNode = {"--master_port=29511"};
const std::vector<std::string> kC10dNodes = {"--nnodes=1:2", "--rdzv_backend=c10d",
                                             "--rdzv_endpoint=localhost:29400"};
const std::vector<std::string> kStandalone = {"--standalone"};
const std::vector<std::string> kOneNode = {};

LaunchSpec parse_with(std::vector<std::string> form, const std::string& conf) {
  form.push_back("--rdzv_conf=" + conf);
  form.push_back("prog");
  return parse(form);
}

std::string error_with(std::vector<std::string> form, const std::string& conf) {
  form.push_back("--rdzv_conf=" + conf);
  form.push_back("prog");
  return error_of(form);
}

// The one notice that names `needle`, or "" when none (or several) does.
std::string notice_about(const LaunchSpec& spec, const std::string& needle) {
  std::string found;
  int count = 0;
  for (const auto& line : spec.notices) {
    if (line.find(needle) != std::string::npos) {
      found = line;
      ++count;
    }
  }
  return count == 1 ? found : "";
}

TEST(TorchHandler, IsTorchrunsChoiceOfRendezvous) {
  auto handler = [](TorchrunShape shape) { return torch_handler(shape); };
  // One node: c10d unless a port or an endpoint keeps torchrun's static.
  EXPECT_EQ(handler({}), TorchHandler::kC10d);
  EXPECT_EQ(handler({.backend = "static"}), TorchHandler::kC10d);
  EXPECT_EQ(handler({.master_port_given = true}), TorchHandler::kStatic);
  EXPECT_EQ(handler({.endpoint_given = true}), TorchHandler::kStatic);
  EXPECT_EQ(handler({.backend = "c10d", .master_port_given = true}), TorchHandler::kC10d);
  EXPECT_EQ(handler({.standalone = true, .master_port_given = true}), TorchHandler::kC10d);
  // Several nodes: the backend named, else static with node ranks and a fixed size.
  EXPECT_EQ(handler({.node_rank_given = true, .min_nodes = 2, .max_nodes = 2}),
            TorchHandler::kStatic);
  EXPECT_EQ(handler({.backend = "static", .min_nodes = 2, .max_nodes = 2}), TorchHandler::kStatic);
  EXPECT_EQ(handler({.backend = "c10d", .node_rank_given = true, .min_nodes = 2, .max_nodes = 2}),
            TorchHandler::kC10d);
  EXPECT_EQ(handler({.endpoint_given = true, .min_nodes = 1, .max_nodes = 2}), TorchHandler::kC10d);
}

TEST(RdzvConfKeys, TimeoutIsTheJoinTimeoutOfTheStaticFormOnly) {
  EXPECT_DOUBLE_EQ(parse_with(kStaticNodes, "timeout=90").rdzv_conf.join_timeout_s, 90);
  EXPECT_DOUBLE_EQ(parse_with(kStaticOneNode, "timeout=90").rdzv_conf.join_timeout_s, 90);
  EXPECT_NE(error_with(kStaticNodes, "timeout=x").find("--rdzv_conf: timeout=x is not a number"),
            std::string::npos);
  for (const auto& form : {kC10dNodes, kStandalone, kOneNode}) {
    const LaunchSpec spec = parse_with(form, "timeout=5");
    EXPECT_DOUBLE_EQ(spec.rdzv_conf.join_timeout_s, 600);
    EXPECT_NE(notice_about(spec,
                           "--rdzv_conf timeout=5 has no effect: torchrun reads timeout "
                           "only in its static rendezvous"),
              "");
    // Not read, so not parsed: torchrun runs it.
    EXPECT_EQ(error_with(form, "timeout=x"), "<no error>");
  }
}

TEST(RdzvConfKeys, TimeoutWinsOverJoinTimeoutInTheStaticForm) {
  const LaunchSpec spec = parse_with(kStaticNodes, "join_timeout=7,timeout=9");
  EXPECT_DOUBLE_EQ(spec.rdzv_conf.join_timeout_s, 9);
  EXPECT_NE(notice_about(spec, "join_timeout has no effect: timeout is given"), "");
  EXPECT_TRUE(parse_with(kStaticNodes, "join_timeout=9,timeout=9").notices.empty());
  EXPECT_DOUBLE_EQ(parse_with(kC10dNodes, "join_timeout=7,timeout=9").rdzv_conf.join_timeout_s, 7);
}

TEST(RdzvConfKeys, KeepAliveIntervalIsReadWithC10dOnly) {
  for (const auto& form : {kC10dNodes, kStandalone, kOneNode}) {
    EXPECT_DOUBLE_EQ(parse_with(form, "keep_alive_interval=2").rdzv_conf.heartbeat_interval_s, 2);
  }
  for (const auto& form : {kStaticNodes, kStaticOneNode}) {
    const LaunchSpec spec = parse_with(form, "keep_alive_interval=2");
    EXPECT_DOUBLE_EQ(spec.rdzv_conf.heartbeat_interval_s, 1);
    EXPECT_NE(notice_about(spec,
                           "keep_alive_interval=2 has no effect: torchrun reads "
                           "keep_alive_interval only with --rdzv_backend=c10d"),
              "");
  }
}

TEST(RdzvConfKeys, KeepAliveMaxAttemptIsReadWithC10dOnly) {
  EXPECT_DOUBLE_EQ(parse_with(kC10dNodes, "keep_alive_max_attempt=4").rdzv_conf.heartbeat_timeout_s,
                   4);
  const LaunchSpec spec = parse_with(kStaticNodes, "keep_alive_max_attempt=4");
  EXPECT_DOUBLE_EQ(spec.rdzv_conf.heartbeat_timeout_s, 10);
  EXPECT_NE(notice_about(spec, "keep_alive_max_attempt=4 has no effect"), "");
  EXPECT_EQ(error_with(kStaticNodes, "keep_alive_max_attempt=0"), "<no error>");
}

TEST(RdzvConfKeys, IsHostIsReadWithC10dOnlyAndNeverRefusedInTheStaticForm) {
  EXPECT_EQ(parse_with(kC10dNodes, "is_host=1").rdzv_conf.is_host, true);
  const LaunchSpec spec = parse_with(kStaticNodes, "is_host=1");
  EXPECT_FALSE(spec.rdzv_conf.is_host.has_value());
  EXPECT_FALSE(spec.hosts_rendezvous());  // node rank 1
  EXPECT_NE(notice_about(spec, "is_host=1 has no effect: in the static form node rank 0 hosts"),
            "");
}

// ddprun's own keys, with a value and what it sets; they apply in every form.
struct OwnKey {
  std::string item;
  double (*read)(const RdzvConf&);
  double expected;
};

class DdprunKeys : public ::testing::TestWithParam<OwnKey> {};

TEST_P(DdprunKeys, ApplyInEveryForm) {
  const OwnKey& key = GetParam();
  for (const auto& form : {kStaticNodes, kStaticOneNode, kC10dNodes, kStandalone, kOneNode}) {
    const LaunchSpec spec = parse_with(form, key.item);
    EXPECT_DOUBLE_EQ(key.read(spec.rdzv_conf), key.expected) << key.item;
    EXPECT_TRUE(spec.notices.empty()) << key.item << ": " << spec.notices.front();
  }
}

INSTANTIATE_TEST_SUITE_P(
    RdzvConfKeys, DdprunKeys,
    ::testing::Values(
        OwnKey{"join_timeout=7", [](const RdzvConf& c) { return c.join_timeout_s; }, 7},
        OwnKey{"last_call_timeout=0", [](const RdzvConf& c) { return c.last_call_timeout_s; }, 0},
        OwnKey{"heartbeat_interval=2", [](const RdzvConf& c) { return c.heartbeat_interval_s; }, 2},
        OwnKey{"heartbeat_timeout=4", [](const RdzvConf& c) { return c.heartbeat_timeout_s; }, 4},
        OwnKey{"close_timeout=3", [](const RdzvConf& c) { return c.close_timeout_s.value_or(0); },
               3},
        OwnKey{"read_timeout=7", [](const RdzvConf& c) { return c.read_timeout_s; }, 7},
        OwnKey{"max_key_bytes=512",
               [](const RdzvConf& c) { return static_cast<double>(c.max_key_bytes); }, 512},
        OwnKey{"max_value_bytes=1024",
               [](const RdzvConf& c) { return static_cast<double>(c.max_value_bytes); }, 1024},
        OwnKey{"max_keys=9", [](const RdzvConf& c) { return static_cast<double>(c.max_keys); }, 9},
        OwnKey{"max_store_bytes=100000",
               [](const RdzvConf& c) { return static_cast<double>(c.max_store_bytes); }, 100000},
        OwnKey{"max_pending_waits=5",
               [](const RdzvConf& c) { return static_cast<double>(c.max_pending_waits); }, 5},
        OwnKey{"max_message_bytes=9000000",
               [](const RdzvConf& c) { return static_cast<double>(c.max_message_bytes); },
               9000000}),
    [](const ::testing::TestParamInfo<OwnKey>& info) {
      return info.param.item.substr(0, info.param.item.find('='));
    });

// Keys torch 2.x reads that mean nothing to ddprun's rendezvous (use_libuv
// is read by no handler of torch 2.x; rank is overwritten with --node_rank).
class KeysWithoutEffect : public ::testing::TestWithParam<std::string> {};

TEST_P(KeysWithoutEffect, GiveANoticeInEveryForm) {
  const std::string item = GetParam() + "=1";
  for (const auto& form : {kStaticNodes, kStaticOneNode, kC10dNodes, kStandalone, kOneNode}) {
    EXPECT_NE(notice_about(parse_with(form, item), "--rdzv_conf " + item + " has no effect"), "")
        << item;
  }
}

INSTANTIATE_TEST_SUITE_P(RdzvConfKeys, KeysWithoutEffect,
                         ::testing::Values("use_libuv", "store_type", "cas_backoff_max_seconds",
                                           "rank", "my_backend_key"));

TEST(RdzvConfKeys, AQuotedListFailsOnlyWhereTimeoutIsRead) {
  // Passed with its quotes, as scripts that quote inside a variable do.
  const std::string quoted = "'join_timeout=5,last_call_timeout=1,timeout=5'";
  const LaunchSpec spec = parse_with(kC10dNodes, quoted);
  EXPECT_DOUBLE_EQ(spec.rdzv_conf.join_timeout_s, 600);  // torchrun ignores 'join_timeout too
  EXPECT_DOUBLE_EQ(spec.rdzv_conf.last_call_timeout_s, 1);
  EXPECT_NE(notice_about(spec, "'join_timeout=5 has no effect: not a key ddprun knows"), "");
  EXPECT_NE(notice_about(spec, "a quote is left in it"), "");
  EXPECT_NE(notice_about(spec, "timeout=5' has no effect"), "");
  EXPECT_NE(error_with(kStaticNodes, quoted)
                .find("--rdzv_conf: timeout=5' is not a number (a quote is left in it"),
            std::string::npos);
}

TEST(RdzvConfKeys, SpacesAroundKeysAndValuesAreStrippedAsByTorchrun) {
  const LaunchSpec spec = parse_with(kC10dNodes, "join_timeout = 5, last_call_timeout=2 ");
  EXPECT_DOUBLE_EQ(spec.rdzv_conf.join_timeout_s, 5);
  EXPECT_DOUBLE_EQ(spec.rdzv_conf.last_call_timeout_s, 2);
  EXPECT_TRUE(spec.notices.empty());
}

TEST(RdzvConfKeys, TheStandaloneServerReadsThemAsC10d) {
  std::vector<std::string> notices;
  const RdzvConf conf =
      parse_rdzv_conf("timeout=3,keep_alive_interval=2", TorchHandler::kC10d, &notices);
  EXPECT_DOUBLE_EQ(conf.join_timeout_s, 600);
  EXPECT_DOUBLE_EQ(conf.heartbeat_interval_s, 2);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("timeout=3 has no effect"), std::string::npos) << notices[0];
}

}  // namespace
}  // namespace ddp::launcher
