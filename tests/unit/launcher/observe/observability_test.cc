// The pure parts of ddprun's observability: rank states, the status table
// and JSON, event records, the metric set (and its documentation), runtime
// entries; and the event log's writer (a real file, and /dev/full).

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "observe/event_log.h"
#include "observe/event_record.h"
#include "observe/job_status.h"
#include "observe/metric_set.h"
#include "observe/runtime_registry.h"

namespace ddp::launcher {
namespace {

JobStatus two_rank_job() {
  JobStatus job;
  job.run_id = "job1";
  job.endpoint = "h:1";
  job.round = 2;
  NodeStatus n;
  n.node_rank = 0;
  n.host = "node0";
  n.heartbeat_age_s = 0.5;
  RankStatus r0;
  r0.rank = 0;
  r0.pid = 100;
  r0.state = RankState::kInCollective;
  r0.collective_op = "all_reduce";
  r0.collective_seq = 57;
  r0.in_collective_s = 3;
  r0.libddp = true;
  r0.steps = 120;
  r0.step_median_s = 0.0453;
  r0.step_p99_s = 1.5;
  RankStatus r1;
  r1.rank = 1;
  r1.local_rank = 1;
  r1.pid = 101;
  r1.state = RankState::kExited;
  r1.exit_signal = 9;
  r1.exit_code = 137;
  n.ranks = {r0, r1};
  job.nodes = {n};
  return job;
}

TEST(JobStatus, ClassifiesRanks) {
  RankObservation o;
  o.running = true;
  EXPECT_EQ(classify_rank(o, false), RankState::kStarting);
  EXPECT_EQ(classify_rank(o, true), RankState::kRunning);
  o.since_start_s = 10;
  EXPECT_EQ(classify_rank(o, false), RankState::kRunning);
  o.attached = true;
  o.begun = 5;
  o.completed = 4;
  EXPECT_EQ(classify_rank(o, false), RankState::kInCollective);
  o.stopped = true;
  EXPECT_EQ(classify_rank(o, false), RankState::kStopped);
  o.running = false;
  o.exited = true;
  EXPECT_EQ(classify_rank(o, false), RankState::kExited);
}

TEST(JobStatus, StateTextAndAges) {
  JobStatus job = two_rank_job();
  EXPECT_EQ(state_text(job.nodes[0].ranks[0]), "in all_reduce #57 for 3.0 s");
  EXPECT_EQ(state_text(job.nodes[0].ranks[1]), "exited SIGKILL");
  RankStatus exited;
  exited.state = RankState::kExited;
  exited.exit_code = 3;
  EXPECT_EQ(state_text(exited), "exited 3");
  EXPECT_EQ(format_age(-1), "-");
  EXPECT_EQ(format_age(125), "2 m 05 s");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_duration(0.00085), "850 us");
  EXPECT_EQ(format_duration(0.0453), "45.3 ms");
  EXPECT_EQ(format_duration(1.25), "1.2 s");
}

TEST(JobStatus, TableNamesEveryRankAndNode) {
  const std::string table = format_status_table(two_rank_job());
  EXPECT_NE(table.find("run job1  round 2"), std::string::npos) << table;
  EXPECT_NE(table.find("world size 2"), std::string::npos) << table;
  EXPECT_NE(table.find("node0"), std::string::npos) << table;
  EXPECT_NE(table.find("in all_reduce #57"), std::string::npos) << table;
  EXPECT_NE(table.find("exited SIGKILL"), std::string::npos) << table;
  // Steps and their time for a libddp rank; "-" for one that never timed a step.
  EXPECT_NE(table.find("120 (45.3 ms, p99 1.5 s)"), std::string::npos) << table;
  EXPECT_NE(table.find("STEPS"), std::string::npos) << table;
}

TEST(JobStatus, JsonIsOneObjectWithEscapes) {
  JobStatus job = two_rank_job();
  job.run_id = "a\"b\n";
  const std::string json = status_json(job);
  EXPECT_EQ(json.back(), '\n');
  EXPECT_EQ(json.find('\n'), json.size() - 1);
  EXPECT_NE(json.find("\"run_id\":\"a\\\"b\\n\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"world_size\":2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\":\"in_collective\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"steps\":120,\"step_median_s\":0.045300,\"step_p99_s\":1.500000"),
            std::string::npos)
      << json;
  EXPECT_EQ(json_quote(std::string("\x01", 1)), "\"\\u0001\"");
}

TEST(EventRecord, TorchelasticFieldNamesAndOptionalFields) {
  EventRecord e;
  e.name = "worker_exit";
  e.source = "WORKER";
  e.timestamp_ms = 1700000000123;
  e.run_id = "r";
  e.round = 3;
  e.group_rank = 1;
  e.global_rank = 5;
  e.signal = 9;
  const std::string line = format_event(e);
  EXPECT_EQ(line,
            "{\"name\":\"worker_exit\",\"source\":\"WORKER\",\"timestamp\":1700000000123,"
            "\"run_id\":\"r\",\"round\":3,\"group_rank\":1,\"global_rank\":5,\"signal\":9}\n");
}

TEST(MetricSet, AtLeastFifteenUniqueSeriesEachSampled) {
  std::set<std::string> names;
  for (const auto& d : metric_defs()) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    EXPECT_EQ(d.name.rfind("ddprun_", 0), 0u) << d.name;
    if (d.type == MetricType::kCounter) {
      EXPECT_EQ(d.name.substr(d.name.size() - 6), "_total") << d.name;
    }
  }
  EXPECT_GE(names.size(), 15u);
  NodeStatus node = two_rank_job().nodes[0];
  node.world_size = 2;
  NodeCounters c;
  c.restarts["hang"] = 2;
  NodeExtras extras;  // as on the node that hosts the rendezvous
  extras.node_stragglers = {{0, "node0", 0.0, false}, {1, "node1", 0.12, true}};
  std::set<std::string> sampled;
  for (const auto& s : metric_samples(node, c, extras)) {
    EXPECT_TRUE(names.count(s.name)) << s.name;
    sampled.insert(s.name);
    if (s.name == "ddprun_world_size") {
      EXPECT_EQ(s.value, 2);
    }
    if (s.name == "ddprun_restarts_total" && s.labels[0].second == "hang") {
      EXPECT_EQ(s.value, 2);
    }
    if (s.name == "ddprun_workers" && s.labels[0].second == "exited") {
      EXPECT_EQ(s.value, 1);
    }
    if (s.name == "ddprun_node_straggler" || s.name == "ddprun_node_straggler_score") {
      ASSERT_EQ(s.labels.size(), 2u);
      const bool slow = s.labels[0].second == "1";
      EXPECT_EQ(s.labels[1].second, slow ? "node1" : "node0");
      EXPECT_EQ(s.value, s.name == "ddprun_node_straggler" ? (slow ? 1 : 0) : (slow ? 0.12 : 0));
    }
  }
  EXPECT_EQ(sampled, names);
}

TEST(MetricSet, EverySeriesIsDocumented) {
  std::ifstream in(OBS_DOC_PATH);
  std::stringstream doc;
  doc << in.rdbuf();
  ASSERT_FALSE(doc.str().empty()) << OBS_DOC_PATH;
  for (const auto& d : metric_defs()) {
    EXPECT_NE(doc.str().find("`" + d.name + "`"), std::string::npos)
        << d.name << " is not in docs/observability.md";
  }
}

TEST(RuntimeRegistry, EntriesRoundTrip) {
  RuntimeEntry e{1234, "job", "127.0.0.1:5", "secret", ""};
  auto back = parse_entry(format_entry(e));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->pid, 1234);
  EXPECT_EQ(back->endpoint, "127.0.0.1:5");
  EXPECT_EQ(back->token, "secret");
  EXPECT_FALSE(parse_entry("run_id=x\n"));
}

// A registered job that does not answer ddprun status: the true reason,
// never "an older ddprun" (the job registered itself, so it is this one).
TEST(UnansweredJob, ReasonSaysWhatAnsweredAndWhereTheJobRuns) {
  const NetworkPlace here{"net:[1]", "net:[1]"};
  const NetworkPlace elsewhere{"net:[2]", "net:[1]"};
  const std::string ep = "127.0.0.1:29400";
  const std::string down =
      unanswered_reason(AskFailure::kNoAnswer, "failed to connect", 42, ep, here);
  EXPECT_EQ(down.rfind("nothing answers at 127.0.0.1:29400 from here (failed to connect): its "
                       "rendezvous is down",
                       0),
            0u)
      << down;
  const std::string netns =
      unanswered_reason(AskFailure::kNoAnswer, "failed to connect", 42, ep, elsewhere);
  EXPECT_NE(netns.find("its ddprun runs in another network namespace (net:[2], this one is "
                       "net:[1]"),
            std::string::npos)
      << netns;
  EXPECT_NE(netns.find("nsenter --net=/proc/42/ns/net ddprun status"), std::string::npos) << netns;
  const std::string foreign = unanswered_reason(AskFailure::kNotARendezvous, "", 42, ep, elsewhere);
  EXPECT_NE(foreign.find("a gRPC server that is not its rendezvous answers at 127.0.0.1:29400"),
            std::string::npos)
      << foreign;
  EXPECT_NE(foreign.find("another network namespace"), std::string::npos) << foreign;
  for (auto failure : {AskFailure::kNoAnswer, AskFailure::kNotARendezvous, AskFailure::kAnotherJob,
                       AskFailure::kRefusedToken, AskFailure::kOther}) {
    for (const auto& place : {here, elsewhere, NetworkPlace{}}) {
      const std::string why = unanswered_reason(failure, "x", 42, ep, place);
      EXPECT_EQ(why.find("older ddprun"), std::string::npos) << why;
      EXPECT_EQ(why.find('\n'), std::string::npos) << why;
      EXPECT_NE(why.find(ep), std::string::npos) << why;
    }
  }
  // The namespace is not said when it cannot be read.
  EXPECT_EQ(unanswered_reason(AskFailure::kNoAnswer, "x", 42, ep, NetworkPlace{"", "net:[1]"})
                .find("namespace"),
            std::string::npos);
}

TEST(UnansweredJob, OneLineOrOneJsonObject) {
  const UnansweredJob job{4242, "job\"1", "10.0.0.1:29400", "nothing answers"};
  EXPECT_EQ(format_unanswered(job),
            "ddprun pid 4242, run 'job\"1', rendezvous 10.0.0.1:29400: not answered: nothing "
            "answers\n");
  EXPECT_EQ(unanswered_json(job),
            "{\"pid\":4242,\"run_id\":\"job\\\"1\",\"endpoint\":\"10.0.0.1:29400\","
            "\"answered\":false,\"error\":\"nothing answers\"}\n");
}

TEST(EventLog, WritesEveryRecordAsOneLine) {
  char path[] = "/tmp/ddp-events-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    EventLog log(path);
    for (int i = 0; i < 100; ++i) {
      EventRecord e;
      e.name = "worker_start";
      e.global_rank = i;
      log.post(e);
    }
  }
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    EXPECT_NE(line.find("\"global_rank\":" + std::to_string(lines)), std::string::npos) << line;
    ++lines;
  }
  EXPECT_EQ(lines, 100);
  unlink(path);
}

TEST(EventLog, AFullDiskDoesNotBlockPosting) {
  EventLog log("/dev/full");
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10000; ++i) log.post(EventRecord{});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace ddp::launcher
