#include "rpc/status_proto.h"

#include <algorithm>

namespace ddp::launcher {

v1::NodeState to_proto(const NodeStatus& n) {
  v1::NodeState s;
  s.set_node_rank(n.node_rank);
  s.set_host(n.host);
  s.set_round(n.round);
  s.set_restarts(n.restarts);
  s.set_relaunches(n.relaunches);
  s.set_age_s(n.age_s);
  s.set_run_id(n.run_id);
  s.set_world_size(n.world_size);
  for (const auto& r : n.ranks) {
    v1::RankState* p = s.add_ranks();
    p->set_rank(r.rank);
    p->set_local_rank(r.local_rank);
    p->set_pid(r.pid);
    p->set_state(rank_state_name(r.state));
    p->set_collective_op(r.collective_op);
    p->set_collective_seq(r.collective_seq);
    p->set_in_collective_s(r.in_collective_s);
    p->set_exit_code(r.exit_code);
    p->set_exit_signal(r.exit_signal);
    p->set_last_output_age_s(r.last_output_age_s);
    p->set_cpu_percent(r.cpu_percent);
    p->set_rss_bytes(r.rss_bytes);
    p->set_collectives_done(r.collectives_done);
    p->set_collective_wait_s(r.collective_wait_s);
    p->set_incarnation(r.incarnation);
    p->set_libddp(r.libddp);
    p->set_straggler_score(r.straggler_score);
    p->set_straggler(r.straggler);
    p->set_steps(r.steps);
    p->set_step_median_s(r.step_median_s);
    p->set_step_p99_s(r.step_p99_s);
  }
  return s;
}

NodeStatus from_proto(const v1::NodeState& s) {
  NodeStatus n;
  n.node_rank = s.node_rank();
  n.host = s.host();
  n.round = s.round();
  n.restarts = s.restarts();
  n.relaunches = s.relaunches();
  n.age_s = s.age_s();
  n.run_id = s.run_id();
  n.world_size = s.world_size();
  for (const auto& p : s.ranks()) {
    RankStatus r;
    r.rank = p.rank();
    r.local_rank = p.local_rank();
    r.pid = p.pid();
    r.state = rank_state_of(p.state());
    r.collective_op = p.collective_op();
    r.collective_seq = p.collective_seq();
    r.in_collective_s = p.in_collective_s();
    r.exit_code = p.exit_code();
    r.exit_signal = p.exit_signal();
    r.last_output_age_s = p.last_output_age_s();
    r.cpu_percent = p.cpu_percent();
    r.rss_bytes = p.rss_bytes();
    r.collectives_done = p.collectives_done();
    r.collective_wait_s = p.collective_wait_s();
    r.incarnation = p.incarnation();
    r.libddp = p.libddp();
    r.straggler_score = p.straggler_score();
    r.straggler = p.straggler();
    r.steps = p.steps();
    r.step_median_s = p.step_median_s();
    r.step_p99_s = p.step_p99_s();
    n.ranks.push_back(std::move(r));
  }
  return n;
}

JobStatus job_from_proto(const v1::StatusResponse& resp, const std::string& endpoint) {
  JobStatus job;
  job.run_id = resp.run_id();
  job.endpoint = endpoint;
  job.round = resp.round();
  job.age_s = resp.server_age_s();
  job.restarts = resp.restarts_used();
  for (const auto& node : resp.nodes()) {
    NodeStatus n = from_proto(node.state());
    n.heartbeat_age_s = node.heartbeat_age_s();
    n.straggler_score = node.straggler_score();
    n.straggler = node.straggler();
    // A single node's server forms no rounds: the node's own view says.
    job.round = std::max(job.round, n.round);
    job.restarts = std::max(job.restarts, n.restarts);
    job.age_s = std::max(job.age_s, n.age_s);
    job.nodes.push_back(std::move(n));
  }
  std::sort(job.nodes.begin(), job.nodes.end(),
            [](const NodeStatus& a, const NodeStatus& b) { return a.node_rank < b.node_rank; });
  return job;
}

}  // namespace ddp::launcher
