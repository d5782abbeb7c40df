// The Healer's store protocol. Keys, under heal/<run>/round<R>/ of the job's
// rendezvous store:
//   e<N>/arrived/<id>  a process's Arrival at epoch N (quorum.h)
//   e<N>/close         counter: the process that raises it to 1 closes epoch N
//   e<N>/members       the closer's decision: the members' arrivals, in rank order
//   latest             the newest epoch that has members (a hint for arrivals)
//   joiners, joiner/<t> processes asking to be admitted (ticket t)
//   finished           set when training ended: arrivals stop waiting

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <thread>

#include "core/init_parts.h"
#include "core/lost_nodes.h"
#include "core/process_identity.h"
#include "ddp/common/rendezvous_types.h"
#include "ddp/heal.h"
#include "ddp/log.h"
#include "heal/quorum.h"
#include "heal/state_memory.h"
#include "heal/state_transfer.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using detail::Arrival;
using detail::kBigTransferBytes;
using detail::kMaxStripes;
using detail::kTransferChunkBytes;
using detail::StateTransfer;

std::optional<std::string> peek(Store& store, const std::string& key) {
  try {
    return store.get(key, std::chrono::milliseconds(1));
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::chrono::milliseconds heal_wait(const HealOptions& options) {
  if (options.wait.count() > 0) return options.wait;
  if (const char* t = std::getenv("DDP_HEAL_WAIT_S"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    const double seconds = std::strtod(t, &end);
    if (end == t || *end != '\0' || !(seconds > 0)) {
      throw Error("environment variable DDP_HEAL_WAIT_S='" + std::string(t) +
                  "' is not a positive number");
    }
    return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  }
  return std::chrono::seconds(5);
}

std::uint64_t stripe_bytes(const HealOptions& options) {
  if (options.stripe_bytes > 0) return options.stripe_bytes;
  if (const char* t = std::getenv("DDP_HEAL_STRIPE_MB"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    const double mib = std::strtod(t, &end);
    if (end == t || *end != '\0' || !(mib > 0) || mib > 1e9) {
      throw Error("environment variable DDP_HEAL_STRIPE_MB='" + std::string(t) +
                  "' is not a positive number of MiB");
    }
    return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(mib * 1024 * 1024));
  }
  return 32 << 20;
}

// The file ddprun checks before relaunching this rank instead of restarting the group.
void mark_able_to_heal(const std::string& path) {
  if (path.empty()) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("heal: cannot create DDP_HEAL_MARK file " + path);
  ::close(fd);
}

}  // namespace

struct Healer::Impl {
  ProcessGroupOptions options;
  HealOptions heal;
  std::shared_ptr<Store> store;        // the protocol's keys
  std::shared_ptr<Store> group_store;  // the groups' keys (each epoch scopes its own)
  Arrival me;
  std::vector<Arrival> current;    // the current epoch's members
  std::vector<Arrival> heal_from;  // the members when the heal in progress began
  std::uint64_t epoch = 0;
  detail::DeathOracle dead = detail::local_death_oracle();
  // The current epoch's nodes the rendezvous leaves out from the time its
  // members were known, and its members whose node's ddprun saw them exit:
  // they count as dead when the next one forms (across machines no pid can
  // be checked, and they would otherwise be waited for until
  // HealOptions::wait, or until a relaunch arrives in their place).
  std::optional<detail::LostNodes> lost;
  std::map<int, Arrival> joiners;  // by id: the newest ticket of each
  std::int64_t tickets_read = 0;
  // arrivals_waiting(): boundaries left to skip, and since the last asking;
  // `paced`: that asking was at a boundary of this group. The time from a
  // group's making to its first asking says nothing of a step's length
  // (right after a reform it is a few ms): skipping on it would let the
  // first step go by unasked, and a relaunch asking meanwhile would wait a
  // whole step (seconds for a large model).
  int skip = 0, last_skip = 0;
  int boundaries = 0;
  bool paced = false;
  Clock::time_point last_asked = Clock::now();
  // The mean time between step boundaries at the last paced asking (0 until
  // one): how long a reform holds its epoch open for a dead member's
  // relaunch (detail::awaits_relaunch), at most HealOptions::wait.
  std::chrono::nanoseconds step_time{0};

  std::string key(std::uint64_t n, const std::string& rest) const {
    return "e" + std::to_string(n) + "/" + rest;
  }
  // For groups over members that have all arrived (each reform's, and the
  // state transfer's): one on another machine that dies while they connect
  // fails the creation within this, not within the collective timeout.
  ProcessGroupOptions rebuilt() const {
    ProcessGroupOptions o = options;
    o.connect_timeout = std::max<std::chrono::milliseconds>(2 * heal.wait, std::chrono::seconds(5));
    return o;
  }
  void read_new_tickets();
  std::map<int, Arrival> arrivals(std::uint64_t n, const std::vector<Arrival>& previous);
  std::optional<std::vector<Arrival>> form(std::uint64_t n, const std::vector<Arrival>& previous,
                                           bool may_close, Clock::time_point close_by,
                                           Clock::time_point give_up);
  bool admitted(const std::vector<Arrival>& members) const;
  // Adds to `gone` the processes of `previous` (this rank's epoch) that
  // `lost` knows to be gone, but those that arrived (`found`).
  void note_gone(const std::vector<Arrival>& previous, const std::map<int, Arrival>& found,
                 std::set<std::string>& gone);
  bool joiner_pending();
  // Waits to be admitted as an arrival, from epoch `from` on; false when the
  // job finished first.
  bool join(std::uint64_t from, Clock::time_point give_up);
  // Forms epoch `n` as a member of the previous one, else joins a later one.
  bool next_epoch(std::uint64_t n, Clock::time_point give_up);
};

void Healer::Impl::read_new_tickets() {
  const std::int64_t tickets = store->add("joiners", 0);
  for (; tickets_read < tickets; ++tickets_read) {
    const std::string k = "joiner/" + std::to_string(tickets_read + 1);
    if (auto text = peek(*store, k)) {
      Arrival a = detail::decode_arrival(*text, "key " + k);
      joiners[a.id] = a;
    } else {
      break;  // its value is not there yet: read it next time
    }
  }
}

// The arrivals at epoch n of the previous members and of every joiner.
std::map<int, Arrival> Healer::Impl::arrivals(std::uint64_t n,
                                              const std::vector<Arrival>& previous) {
  read_new_tickets();
  std::vector<int> ids;
  for (const Arrival& a : previous) ids.push_back(a.id);
  for (const auto& [id, a] : joiners) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::map<int, Arrival> found;
  for (int id : ids) {
    const std::string k = key(n, "arrived/" + std::to_string(id));
    if (auto text = peek(*store, k)) found[id] = detail::decode_arrival(*text, "key " + k);
  }
  return found;
}

void Healer::Impl::note_gone(const std::vector<Arrival>& previous,
                             const std::map<int, Arrival>& found, std::set<std::string>& gone) {
  lost->refresh();
  for (const Arrival& a : previous) {
    if (gone.count(a.proc) > 0 || dead(a.proc)) continue;
    const auto arrived = found.find(a.id);
    if (arrived != found.end() && arrived->second.proc == a.proc) continue;
    if (lost->lost(a.node) || lost->exited(a.id, detail::pid_in(a.proc))) gone.insert(a.proc);
  }
}

bool Healer::Impl::admitted(const std::vector<Arrival>& members) const {
  return std::any_of(members.begin(), members.end(),
                     [&](const Arrival& a) { return a.id == me.id && a.proc == me.proc; });
}

// Arrives at epoch n and waits for its members. A member of the previous
// epoch may decide them once the rule allows or at `close_by`; an arrival
// (`joining`) only once every previous member arrived or is known dead (when
// all died, the arrivals go on alone; otherwise a survivor decides), and
// stops waiting when the job finished (returns an empty set). Returns the
// members, or nullopt when this process is not among them. Throws HealError
// at `give_up`.
std::optional<std::vector<Arrival>> Healer::Impl::form(std::uint64_t n,
                                                       const std::vector<Arrival>& previous,
                                                       bool joining, Clock::time_point close_by,
                                                       Clock::time_point give_up) {
  store->set(key(n, "arrived/" + std::to_string(me.id)), detail::encode(me));
  if (joining) close_by = Clock::time_point::max();
  std::set<std::string> known_gone;  // procs of `previous` (this rank's epoch): note_gone()
  const detail::DeathOracle gone = [&](const std::string& proc) {
    return known_gone.count(proc) > 0 || dead(proc);
  };
  const auto relaunch_by = Clock::now() + std::min<Clock::duration>(step_time, heal.wait);
  for (;;) {
    if (auto text = peek(*store, key(n, "members"))) {
      auto members = detail::decode_arrivals(*text, "key " + key(n, "members"));
      if (!admitted(members)) return std::nullopt;
      lost = detail::LostNodes::of_group(detail::member_set(n, members));
      return members;
    }
    const auto now = Clock::now();
    if (joining && peek(*store, "finished")) return std::vector<Arrival>{};
    if (!previous.empty() || !joining) {
      auto found = arrivals(n, previous);
      if (!joining && lost) note_gone(previous, found, known_gone);
      auto members = detail::quorum_members(found, gone);
      if (detail::quorum_ready(previous, found, gone, now, close_by) &&
          (joining || !detail::awaits_relaunch(previous, found, gone, now, relaunch_by)) &&
          static_cast<int>(members.size()) >= heal.min_members &&
          store->add(key(n, "close"), 1) == 1) {
        members = detail::quorum_members(arrivals(n, previous), gone);
        store->set(key(n, "members"), detail::encode(members));
        store->set("latest", std::to_string(n));
        continue;  // read back what was published, as every member does
      }
    }
    if (now >= give_up) {
      throw HealError("heal: epoch " + std::to_string(n) + " did not form within " +
                      std::to_string(options.timeout.count()) + " ms (fewer than " +
                      std::to_string(heal.min_members) + " live member(s), or the store stopped)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(joining ? 10 : 1));
  }
}

bool Healer::Impl::join(std::uint64_t from, Clock::time_point give_up) {
  const std::int64_t ticket = store->add("joiners", 1);
  store->set("joiner/" + std::to_string(ticket), detail::encode(me));
  log::debug_all("heal: asked to be admitted (ticket {}, from epoch {})", ticket, from);
  std::uint64_t n = from;
  if (auto latest = peek(*store, "latest"))
    n = std::max<std::uint64_t>(n, std::stoull(*latest) + 1);
  for (;; ++n) {
    std::vector<Arrival> previous;                              // the newest epoch's members
    for (; auto text = peek(*store, key(n, "members")); ++n) {  // formed before this asked
      previous = detail::decode_arrivals(*text, "key " + key(n, "members"));
    }
    if (previous.empty() && n > 0) {
      if (auto text = peek(*store, key(n - 1, "members"))) {
        previous = detail::decode_arrivals(*text, "key " + key(n - 1, "members"));
      }
    }
    auto members = form(n, previous, true, give_up, give_up);
    if (!members) continue;
    if (members->empty()) return false;  // "finished"
    current = *members;
    epoch = n;
    return true;
  }
}

bool Healer::Impl::next_epoch(std::uint64_t n, Clock::time_point give_up) {
  const auto close_by = Clock::now() + heal.wait;
  if (auto members = form(n, current, false, close_by, give_up)) {
    current = *members;
    epoch = n;
    return true;
  }
  return join(n + 1, give_up);
}

// A process asked to be admitted and is not a member (a new process: its
// identity differs from every member's), and it is alive.
bool Healer::Impl::joiner_pending() {
  read_new_tickets();
  for (const auto& [id, a] : joiners) {
    const bool member = std::any_of(current.begin(), current.end(),
                                    [&](const Arrival& m) { return m.proc == a.proc; });
    if (!member && !dead(a.proc)) return true;
  }
  return false;
}

bool Healer::requested() {
  const auto& env = detail::worker_env();
  return env && env->heal && env->world_size > 1;
}

bool Healer::relaunched() {
  const auto& env = detail::worker_env();
  return requested() && env->incarnation > 0;
}

Healer::Healer(const InitOptions& init, const HealOptions& heal) : impl_(std::make_unique<Impl>()) {
  const auto& env = detail::worker_env();
  id_ = env ? env->rank : 0;
  if (!requested()) {
    group_ = ddp::init(init);
    return;
  }
  Impl& s = *impl_;
  s.options = detail::group_options("heal", init);
  // Each epoch's group reuses the pages of the last one's (gradient buckets).
  s.options.shm_carry_arena = true;
  s.heal = heal;
  s.heal.wait = heal_wait(heal);
  s.heal.stripe_bytes = stripe_bytes(heal);
  const std::string scope = env->run_id + "/round" + std::to_string(env->round);
  s.store = make_prefix_store(detail::job_store(), "heal/" + scope);
  s.group_store = make_prefix_store(detail::job_store(), "pg/" + scope + "/heal");
  s.me = {env->rank, env->group_rank, detail::process_identity(), 0};
  mark_able_to_heal(env->heal_mark);
  const auto give_up = Clock::now() + s.options.timeout;
  if (env->incarnation == 0) {
    std::vector<Arrival> launch;
    for (int r = 0; r < env->world_size; ++r) launch.push_back({r, 0, "", 0});
    if (auto members = s.form(0, launch, false, give_up, give_up)) {
      s.current = *members;
      group_ =
          ProcessGroup::create(detail::member_set(0, s.current), id_, s.group_store, s.options);
      // The rendezvous may now admit a new node into this running round.
      if (id_ == 0) detail::job_store()->set(healing_round_key(env->round), "1");
      return;
    }
  }
  joined_late_ = true;
  s.me.committed = -1;
  if (!s.join(0, give_up)) {
    log::info("heal: the job finished before this rank (id {}) was admitted", id_);
    return;
  }
  group_ =
      ProcessGroup::create(detail::member_set(s.epoch, s.current), id_, s.group_store, s.options);
}

Healer::~Healer() = default;

std::future<std::unique_ptr<Healer>> Healer::start(const InitOptions& init,
                                                   const HealOptions& heal) {
  return std::async(std::launch::async,
                    [init, heal] { return std::make_unique<Healer>(init, heal); });
}

void Healer::withdraw() {
  const auto& env = detail::worker_env();
  if (env && !env->heal_mark.empty()) ::unlink(env->heal_mark.c_str());
}

void Healer::finish() {
  if (impl_->store) impl_->store->set("finished", "1");
}

bool Healer::arrivals_waiting() {
  Impl& s = *impl_;
  if (!s.store || !group_) return false;
  ++s.boundaries;
  if (s.skip > 0) {  // every member skips the same boundaries: rank 0 said how many
    --s.skip;
    return false;
  }
  // Rank 0 asks the store and tells every member the answer and how many
  // boundaries to skip before the next asking (about every 50 ms).
  std::int32_t word[2] = {0, 0};
  if (group_->rank() == 0) {
    const auto now = Clock::now();
    word[0] = s.joiner_pending() ? 1 : 0;
    word[1] = s.paced ? detail::boundaries_to_skip(now - s.last_asked, s.boundaries,
                                                   std::chrono::milliseconds(50), s.last_skip)
                      : 0;
  }
  group_->broadcast(word, 2, DType::kInt32, 0);
  if (s.paced && s.boundaries > 0) s.step_time = (Clock::now() - s.last_asked) / s.boundaries;
  s.paced = true;
  s.skip = s.last_skip = word[1];
  s.boundaries = 0;
  s.last_asked = Clock::now();
  return word[0] != 0;
}

void Healer::reform(std::int64_t committed, bool first_of_heal) {
  if (!impl_->store) throw HealError("heal: a heal without ddprun --on_failure=heal");
  Impl& s = *impl_;
  if (group_) group_->abort();
  group_.reset();  // waits for what it had queued: each fails at once now
  s.me.committed = committed;
  if (first_of_heal) s.heal_from = s.current;
  const auto give_up = Clock::now() + s.options.timeout;
  for (std::uint64_t n = s.epoch + 1;; n = s.epoch + 1) {
    if (!s.next_epoch(n, give_up)) {
      throw HealError("heal: the job finished while this rank reformed");
    }
    try {
      group_ = ProcessGroup::create(detail::member_set(s.epoch, s.current), id_, s.group_store,
                                    s.rebuilt());
      change_ = detail::epoch_change(s.heal_from, s.current);
      s.skip = s.last_skip = 0;  // the new group's first two boundaries ask
      s.boundaries = 0;
      s.paced = false;
      s.last_asked = Clock::now();
      return;
    } catch (const Error& e) {
      // A member died while the group formed: the next epoch goes without it.
      log::warn("heal: epoch {} could not form ({}); trying the next", s.epoch, e.what());
    }
  }
}

HealReport Healer::sync_state(std::int64_t committed, const std::vector<ParamBuffer>& state) {
  const auto t0 = Clock::now();
  HealReport report;
  std::vector<std::int64_t> all(static_cast<std::size_t>(group_->size()));
  group_->all_gather(&committed, all.data(), 1, DType::kInt64);
  const auto most = std::max_element(all.begin(), all.end());
  report.committed = *most;
  if (*most < 0) {
    throw HealError("heal: no live member holds the training state (every process that held it " +
                    std::string("is gone; the ") + std::to_string(all.size()) +
                    " member(s) of epoch " + std::to_string(group_->epoch()) +
                    " all just started)");
  }
  if (std::all_of(all.begin(), all.end(), [&](std::int64_t c) { return c == *most; })) {
    return report;
  }
  report.moved = true;
  report.donor = static_cast<int>(most - all.begin());
  for (const ParamBuffer& b : state) report.bytes += b.count * dtype_size(b.dtype);
  const MemberSet& members = group_->members();
  std::vector<int> holders;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] == *most) holders.push_back(static_cast<int>(i));
  }
  const bool spans_nodes =
      std::any_of(members.members.begin(), members.members.end(),
                  [&](const Member& m) { return m.node != members.members.front().node; });
  const ProcessGroupOptions carriers = impl_->rebuilt();
  // A NCCL communicator takes about half a second to form, more than the
  // state of most models takes to cross: the group's own broadcast carries it.
  const bool own_groups = impl_->options.backend != "nccl";
  const std::shared_ptr<Store> transfer_store = own_groups ? impl_->group_store : nullptr;
  const std::size_t chunk = report.bytes >= kBigTransferBytes ? kTransferChunkBytes : 0;
  const StateTransfer transfer{*group_, id_, carriers, transfer_store, all, *most, chunk};
  const std::size_t stripes =
      std::min({holders.size(), kMaxStripes,
                std::max<std::size_t>(
                    1, report.bytes / std::max<std::uint64_t>(1, impl_->heal.stripe_bytes))});
  // A member behind whose transfer fails holds torn buffers: settle() then
  // counts it as holding nothing.
  torn_ = committed < *most;
  if (stripes > 1 && spans_nodes && transfer_store) {
    holders.resize(stripes);
    report.donors = holders;
    transfer.striped(holders, state);
  } else {
    report.donors = {report.donor};
    report.read_directly = transfer.whole(report.donor, state);
  }
  torn_ = false;
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return report;
}

}  // namespace ddp
