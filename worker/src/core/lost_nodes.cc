#include "core/lost_nodes.h"

#include <chrono>
#include <utility>

#include "core/init_parts.h"
#include "ddp/common/rendezvous_types.h"

namespace ddp::detail {

LostNodes::LostNodes(std::shared_ptr<Store> job, std::int64_t round, std::set<int> nodes)
    : job_(std::move(job)), round_(round), nodes_(std::move(nodes)) {
  if (!job_) return;
  try {
    read_ = job_->add(lost_nodes_key(round_), 0);
  } catch (const std::exception&) {
    job_.reset();  // without the count, a node lost before would pass for news
  }
}

std::optional<LostNodes> LostNodes::of_group(const MemberSet& members) {
  // A group made outside ddp::init() (the torch backend) may run in an
  // environment that is no launch's contract at all (a test harness setting
  // WORLD_SIZE alone): that is no job under heal either.
  bool heal = false;
  long round = 0;
  try {
    const auto& env = worker_env();
    heal = env && env->heal;
    round = env ? env->round : 0;
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!heal) return std::nullopt;
  std::set<int> nodes;
  for (const Member& m : members.members) nodes.insert(m.node);
  if (nodes.size() < 2) return std::nullopt;
  try {
    return LostNodes(job_store(), round, std::move(nodes));
  } catch (const std::exception&) {
    return std::nullopt;  // no rendezvous to ask: the groups' own timeouts decide
  }
}

std::optional<std::string> LostNodes::first_lost() {
  if (first_.empty()) refresh();
  if (first_.empty()) return std::nullopt;
  return first_;
}

bool LostNodes::exited(int rank, long pid) const {
  if (!job_) return false;
  try {
    return job_->get(exited_rank_key(round_, rank), std::chrono::milliseconds(1)) ==
           std::to_string(pid);
  } catch (const std::exception&) {
    return false;  // none said so (or the store is unreachable)
  }
}

void LostNodes::refresh() {
  if (!job_) return;
  try {
    const std::int64_t count = job_->add(lost_nodes_key(round_), 0);
    for (; read_ < count; ++read_) {
      // "<GROUP_RANK> <why>"; the rendezvous sets it with the count, at once.
      const std::string text =
          job_->get(lost_node_key(round_, read_ + 1), std::chrono::milliseconds(1));
      const auto space = text.find(' ');
      int node = -1;
      try {
        node = std::stoi(text.substr(0, space));
      } catch (const std::exception&) {
        continue;  // not a mark the rendezvous wrote: no node to name
      }
      lost_.insert(node);
      if (first_.empty() && nodes_.count(node) > 0) {
        first_ = "node " + std::to_string(node) + " was left out by the rendezvous (" +
                 (space == std::string::npos ? std::string("lost") : text.substr(space + 1)) + ")";
      }
    }
  } catch (const std::exception&) {
    // The store is unreachable (or a mark is not readable yet): ask again next time.
  }
}

}  // namespace ddp::detail
