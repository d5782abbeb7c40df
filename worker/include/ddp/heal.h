#pragma once
// Live recovery (ddprun --on_failure=heal): a group that outlives its members.
//
// When a rank dies, the survivors do not restart. A collective fails on each
// of them (within milliseconds on one node; at the latest after the group's
// timeout across nodes); each says so (Healer::step_failed()) and, at its
// next step boundary, Healer::settle() aborts the old group, releases what
// the program built on it, agrees with the other survivors on the next
// epoch's member set through the job's rendezvous store, makes a new group
// over it in this process, syncs the training state and has the program
// build on the new group. ddprun relaunches the dead rank; the new process
// constructs its Healer, which waits to be admitted, and the survivors admit
// it at a step boundary the same way. The members that are behind (a relaunched
// rank, or a survivor whose last step failed while another's succeeded)
// receive the state of the most advanced member, so all hold the same bits.
//
// The protocol is one call at every step boundary, settle(), and one word
// when a step fails, step_failed(); the program says once what to release
// and rebuild and which state every member must hold alike:
//
//   auto healer = ddp::Healer::start().get();     // or make_unique<Healer>()
//   if (!healer->group()) return 0;               // relaunched after the job ended
//   std::int64_t committed = healer->joined_late() ? -1 : 0;
//   ddp::HealParticipant me;
//   me.release = [&] { grad_sync.reset(); };
//   me.state = [&] { return state_buffers(); };
//   me.rebuild = [&](ddp::ProcessGroup& g, const ddp::Settlement& s) {
//     committed = s.committed;
//     grad_sync = make_grad_sync(g);
//   };
//   while (committed < steps) {
//     try {
//       healer->settle(committed, me);           // every boundary
//       ... the step: forward, backward through the GradSync, finish() ...
//       apply_update(); ++committed;           // only once every collective succeeded
//     } catch (const ddp::HealError&) { throw;  // cannot heal: the group restarts
//     } catch (const ddp::Error&) {               // a peer died: nothing was applied
//       healer->step_failed();
//     }
//   }
//   healer->finish();
//
// Agreement: every member of epoch N+1 reads the one set a single closer
// published, so two members never disagree on who is in. A member of epoch N
// is left out when its process is known dead (same machine: its pid), or
// when it has not arrived within HealOptions::wait (another machine). A
// process left out by a race rejoins at the next epoch as an arrival. A step
// any member committed is kept (its gradient sum was whole) and the members
// behind receive it; a step nobody committed is redone by the new group.
//
// Constructing a Healer marks the program as able to heal (the file
// DDP_HEAL_MARK names): ddprun then relaunches this rank when it dies instead
// of restarting every rank. Without ddprun's heal mode (requested() false)
// a Healer is a plain group of the launch's ranks that never reforms.
//
// Thread-safety: one Healer per process, used from one thread. Errors are
// ddp::Error naming what failed; HealError when the heal cannot finish.

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "ddp/params.h"
#include "ddp/process_group.h"

namespace ddp {

// A heal that cannot finish: fewer than HealOptions::min_members live
// members within the group's timeout, or no live member holding the state
// (every process that held it died). The program should save what it holds
// if anything, withdraw() and exit non-zero: ddprun then restarts the group
// (from the last checkpoint) instead of relaunching this rank.
class HealError : public Error {
 public:
  using Error::Error;
};

struct HealOptions {
  // How long survivors wait for a member of the old epoch whose process they
  // cannot check (another machine) before leaving it out. 0: DDP_HEAL_WAIT_S,
  // else 5 s.
  std::chrono::milliseconds wait{0};
  // Fewer members than this after a reform: the heal keeps waiting for
  // arrivals until the group's timeout, then throws HealError.
  int min_members = 1;
  // Across nodes, a state sync stripes the state over as many holders as
  // give each at least this many bytes (each stripe is a group of its own to
  // connect): a small state comes from one member. 0: DDP_HEAL_STRIPE_MB
  // (MiB, fractions allowed), else 32 MiB.
  std::uint64_t stripe_bytes = 0;
};

// How a heal changed the members, by id (launch rank): who
// left, who is new, and who came back as another process (a relaunch that
// was admitted in the same reform that dropped its predecessor).
struct EpochChange {
  std::vector<int> left, arrived, replaced;
};

// What one state sync did, for the trainer's report.
struct HealReport {
  bool moved = false;          // whether any state was sent
  int donor = -1;              // the donor's rank in the new group (-1: nothing moved)
  std::vector<int> donors;     // every rank that sent a share (striped: several), in rank order
  std::int64_t committed = 0;  // the committed step every member now holds
  std::uint64_t bytes = 0;     // bytes the donor (or donors, together) sent
  double seconds = 0;          // time the sync took
  // The members behind read the donor's buffers straight from its state
  // memory (Healer::state_memory(), one node) instead of receiving them.
  bool read_directly = false;
};

// The program's side of a heal: what Healer::settle() calls back. The
// Healer holds the reference only during that call.
struct Settlement;
struct HealParticipant {
  // Required. Drops every object built on the current group (a GradSync, a
  // GradAverager, a ddp::Work): called after the group was aborted (so each
  // one's pending work fails at once instead of waiting) and before the
  // group is replaced. REQUIRES: when it returns, nothing but the Healer
  // holds the group.
  std::function<void()> release;
  // Required. The buffers every member must hold alike (weights, optimizer
  // state, the data position, ...), read before every state sync; a member
  // behind has them overwritten. REQUIRES: the same count, sizes and dtypes
  // on every member, valid until the call that asked returns.
  std::function<std::vector<ParamBuffer>()> state;
  // Required. After every state sync, once no process waits to be admitted:
  // builds again over `group` what `release` drops, and takes
  // Settlement::committed and whatever of the program's own it keeps in the
  // state buffers (they may have been overwritten). Collectives on `group`
  // are allowed; a ddp::Error thrown here (a peer died) makes the heal go on
  // without that peer.
  std::function<void(ProcessGroup& group, const Settlement& settlement)> rebuild;
  // Optional. Collective on the group, on every member before every state
  // sync (e.g. the members rebuild a sharded optimizer's whole state from
  // the shards that survived). `committed`: this member's steps. A
  // ddp::Error thrown here makes the heal go on without the peer that died.
  std::function<void(ProcessGroup& group, std::int64_t committed)> before_sync;
};

// What settle() did, as HealParticipant::rebuild and the caller see it.
struct Settlement {
  // Whether the state was synced and HealParticipant::rebuild called: the
  // first settle() after construction, and every heal.
  bool rebuilt = false;
  // The steps every member holds now (the most advanced member's count).
  std::int64_t committed = 0;
  // The group before the heal (nullopt: no heal, the first sync only).
  std::optional<MemberSet> before;
  // How the members changed from `before` (several reforms in one heal
  // count as one change), by id.
  EpochChange change;
  // The last state sync (nothing moved when every member was level).
  HealReport report;
  // Seconds from the call until the new group was formed (0 when none).
  double reform_seconds = 0;
};

class Healer {
 public:
  // Whether this process runs under ddprun --on_failure=heal.
  static bool requested();
  // Whether this process was relaunched in place of a dead one
  // (DDP_INCARNATION > 0 under heal): its Healer joins the running group and
  // first settle() then overwrites every buffer of its state, so the program
  // need not initialise them (a large model starts that much sooner).
  static bool relaunched();

  // What a block of state_memory() that a relaunch takes over holds at first.
  enum class StateFill {
    kZeros,  // zeros, whatever the predecessor left
    // The predecessor's bytes, as it left them (torn if it died writing):
    // for a relaunched() process whose first settle() overwrites the whole
    // block. Its pages are mapped without being written, about twice as fast
    // as zeroing them.
    kUnspecified,
  };
  // Memory for the program's state (weights, optimizer buffers): `bytes`
  // bytes, page-aligned, reading as zeros, valid while the returned pointer
  // (or a copy of it) lives; thread-safe. Under ddprun's heal mode the first
  // block a process asks for is a file in /dev/shm that outlives the
  // process: when it dies, ddprun hands the file to the process it
  // relaunches in its place, whose state_memory() of the same size takes it
  // over, filled as `fill` says (zeros by default), and says so once. A large
  // model's relaunch then finds its pages made instead of waiting for the
  // kernel to zero fresh ones.
  // Otherwise (no heal mode, this process's first block still lives, or
  // /dev/shm has no room for it: a warning says so) private memory, zeros
  // whatever `fill`. Callable before a Healer exists. Throws ddp::Error for
  // 0 bytes, or naming the file when /dev/shm refuses it.
  static std::shared_ptr<void> state_memory(std::size_t bytes, StateFill fill = StateFill::kZeros);

  // Forms epoch 0 with the launch's ranks or, in a relaunched process
  // (DDP_INCARNATION > 0), waits to be admitted into the running group
  // (bounded by the group's timeout). `init` as for ddp::init().
  explicit Healer(const InitOptions& init = {}, const HealOptions& heal = {});
  // Constructs a Healer on a thread of its own and returns at once, so that
  // the program allocates its state meanwhile: a relaunched process asks to
  // be admitted before its model exists, and the survivors, when they admit
  // it in the heal that drops its predecessor, wait in its state sync for the
  // rest of its allocation instead of one more heal later. get() throws
  // what the constructor threw. Destroying the future waits for the thread
  // (bounded by the group's timeout).
  static std::future<std::unique_ptr<Healer>> start(const InitOptions& init = {},
                                                    const HealOptions& heal = {});
  ~Healer();
  Healer(const Healer&) = delete;
  Healer& operator=(const Healer&) = delete;

  // The current epoch's group. Replaced by every heal (in settle()):
  // a copy kept past one is an aborted group. Null in a
  // relaunched process when the job finished before it was admitted (it
  // should then exit 0).
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  // This member's id: its launch rank (RANK), the same in every epoch.
  int id() const { return id_; }
  // True in a process that joined a running group (it must receive state).
  bool joined_late() const { return joined_late_; }

  // The heal protocol, at every step boundary. Collective on group(): every
  // member calls it before every step (the first time right after
  // construction) and once more after the last one. In order, as needed:
  //  - after step_failed(), or when processes wait to be admitted: aborts
  //    the group, calls participant.release, forms the next epoch with the
  //    live members and those waiting, and makes its group;
  //  - the first time and after that: participant.before_sync, then syncs
  //    the state from the most advanced member, then (unless a process asked
  //    to be admitted meanwhile: another reform first)
  //    participant.rebuild;
  //  - asks whether processes wait to be admitted (rank 0 asks the store
  //    and broadcasts the answer, at most about every 50 ms of boundaries;
  //    otherwise it returns at once).
  // A member that dies meanwhile makes it start over without that member.
  // REQUIRES: no collective of group() in flight on this thread; `committed`
  // is the steps this member applied (-1: holds nothing, joined_late()).
  // Throws HealError when the heal cannot finish: fewer than min_members
  // within the group's timeout, or no live member holding the state. The
  // program should then save what it holds, withdraw() and exit non-zero.
  // Throws ddp::Error when there is no group().
  Settlement settle(std::int64_t committed, const HealParticipant& participant);

  // After a collective of group() threw ddp::Error on this rank: aborts the
  // group at once (peers waiting on this rank stop waiting) and makes the
  // next settle() heal. REQUIRES: the failed step's update was not applied
  // (`committed` counts only applied steps). Never throws.
  void step_failed() noexcept;

  // How the last heal changed the members.
  const EpochChange& last_change() const { return change_; }

  // Call on every member when training is done, after its last settle():
  // processes still waiting to be admitted stop waiting (their Healer then
  // has no group()).
  void finish();
  // This process no longer asks to be relaunched alone (removes its
  // DDP_HEAL_MARK): when it exits with an error, ddprun restarts the group.
  static void withdraw();

 private:
  // The protocol's steps, in the order settle() runs them.
  bool arrivals_waiting();
  // `first_of_heal`: false for a reform that follows another in one heal.
  void reform(std::int64_t committed, bool first_of_heal);
  HealReport sync_state(std::int64_t committed, const std::vector<ParamBuffer>& state);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<ProcessGroup> group_;
  int id_ = 0;
  bool joined_late_ = false;
  EpochChange change_;
  bool settled_ = false;  // the state was synced over the current group
  bool torn_ = false;     // a state sync failed while it overwrote this member's buffers
  bool failed_ = false;   // step_failed() since the last settle()
};

}  // namespace ddp
