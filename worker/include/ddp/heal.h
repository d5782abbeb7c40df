#pragma once
// Live recovery (ddprun --on_failure=heal): a group that outlives its members.
//
// When a rank dies, the survivors do not restart. A collective fails on each
// of them (within milliseconds on one node; at the latest after the group's
// timeout across nodes); each calls reform(), which aborts the old group,
// agrees with the other survivors on the next epoch's member set through the
// job's rendezvous store, and makes a new group over it in this process.
// ddprun relaunches the dead rank; the new process constructs its Healer,
// which waits to be admitted, and the survivors admit it at a step boundary
// (arrivals_waiting() then reform()). After every reform() each member calls
// sync_state(): the members that are behind (a relaunched rank, or a
// survivor whose last step failed while another's succeeded) receive the
// state of the most advanced member, so all hold the same bits.
//
// Agreement: every member of epoch N+1 reads the one set a single closer
// published, so two members never disagree on who is in. A member of epoch N
// is left out when its process is known dead (same machine: its pid), or
// when it has not arrived within HealOptions::wait (another machine). A
// process left out by a race rejoins at the next epoch as an arrival.
//
// Constructing a Healer marks the program as able to heal (the file
// DDP_HEAL_MARK names): ddprun then relaunches this rank when it dies instead
// of restarting every rank. Without ddprun's heal mode (requested() false)
// a Healer is a plain group of the launch's ranks that never reforms.
//
// Thread-safety: one Healer per process, used from one thread. Errors are
// ddp::Error naming what failed (a heal that cannot finish: too few members
// within the join timeout, a store that stopped answering).

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
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
  // Fewer members than this after a reform: reform() keeps waiting for
  // arrivals until the group's timeout, then throws.
  int min_members = 1;
  // Across nodes, sync_state() stripes the state over as many holders as
  // give each at least this many bytes (each stripe is a group to connect,
  // tens of milliseconds): a small state comes from one member. 0:
  // DDP_HEAL_STRIPE_MB (MiB, fractions allowed), else 32 MiB.
  std::uint64_t stripe_bytes = 0;
};

// How the last reform() changed the members, by id (launch rank): who
// left, who is new, and who came back as another process (a relaunch that
// was admitted in the same reform that dropped its predecessor).
struct EpochChange {
  std::vector<int> left, arrived, replaced;
};

// What one sync_state() did, for the trainer's report.
struct HealReport {
  bool moved = false;          // whether any state was sent
  int donor = -1;              // the donor's rank in the new group (-1: nothing moved)
  std::vector<int> donors;     // every rank that sent a share (striped: several), in rank order
  std::int64_t committed = 0;  // the committed step every member now holds
  std::uint64_t bytes = 0;     // bytes the donor (or donors, together) sent
  double seconds = 0;          // time sync_state() took
  // The members behind read the donor's buffers straight from its state
  // memory (Healer::state_memory(), one node) instead of receiving them.
  bool read_directly = false;
};

class Healer {
 public:
  // Whether this process runs under ddprun --on_failure=heal.
  static bool requested();
  // Whether this process was relaunched in place of a dead one
  // (DDP_INCARNATION > 0 under heal): its Healer joins the running group and
  // sync_state() then overwrites every buffer of its state, so the program
  // need not initialise them (a large model starts that much sooner).
  static bool relaunched();

  // What a block of state_memory() that a relaunch takes over holds at first.
  enum class StateFill {
    kZeros,  // zeros, whatever the predecessor left
    // The predecessor's bytes, as it left them (torn if it died writing):
    // for a relaunched() process whose sync_state() overwrites the whole
    // block. Its pages are mapped without being written, about twice as fast
    // as zeroing them (1 GiB: 65 ms instead of 150 ms on a 2-vCPU machine).
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
  // kernel to zero fresh ones (about 1 GB/s on a busy virtual machine).
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
  // it in the reform that drops its predecessor, wait in sync_state() for the
  // rest of its allocation instead of one more reform later. get() throws
  // what the constructor threw. Destroying the future waits for the thread
  // (bounded by the group's timeout).
  static std::future<std::unique_ptr<Healer>> start(const InitOptions& init = {},
                                                    const HealOptions& heal = {});
  ~Healer();
  Healer(const Healer&) = delete;
  Healer& operator=(const Healer&) = delete;

  // The current epoch's group. Valid until the next reform(). Null in a
  // relaunched process when the job finished before it was admitted (it
  // should then exit 0).
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  // This member's id: its launch rank (RANK), the same in every epoch.
  int id() const { return id_; }
  // True in a process that joined a running group (it must receive state).
  bool joined_late() const { return joined_late_; }

  // Collective on group(), at every step boundary on every member: whether
  // processes wait to be admitted (then every member calls reform()). The
  // same on every member. The members communicate (one small broadcast from
  // rank 0) only about every 50 ms of boundaries: the first two calls after
  // a rebuild ask (the first one's time since the rebuild is no step's
  // length), then skipping 1, 3, 7, ... and at most 64 in a row (so
  // admission waits at most 65 steps); at the others it returns false at
  // once. Throws as a collective does when a peer died.
  bool arrivals_waiting();

  // What the last reform() changed.
  const EpochChange& last_change() const { return change_; }

  // After a collective of the current group failed on this rank, or when
  // arrivals_waiting() said so: aborts the current group, agrees on the next
  // epoch's members (the survivors and the arrivals) and makes its group.
  // `committed`: the steps this rank has applied (published for
  // sync_state()). Throws HealError when fewer than min_members remain
  // within the group's timeout.
  const std::shared_ptr<ProcessGroup>& reform(std::int64_t committed);

  // Collective on group(), after construction and after every reform():
  // when members hold different committed step counts (or a member joined
  // late), the lowest-ranked member with the highest count sends `state`
  // (its buffers, the same layout on every member) to the members behind
  // (in a group of their own, made for it: the members that hold it already
  // return once the counts are compared) and its count goes into
  // `committed` everywhere. When the group spans several nodes and the state
  // is large (HealOptions::stripe_bytes), it is striped instead: each of the
  // first (at most 4) members holding it sends an equal share of every
  // buffer, all at once, in a group of its own with the members behind, so
  // no one sender's link carries it all.
  // `committed` < 0 means "holds nothing" (a process that just joined).
  // Throws as a collective does, and HealError when no member holds anything.
  HealReport sync_state(std::int64_t& committed, const std::vector<ParamBuffer>& state);

  // Call on every member when training is done: processes still waiting to
  // be admitted stop waiting (their Healer then has no group()).
  void finish();
  // This process no longer asks to be relaunched alone (removes its
  // DDP_HEAL_MARK): when it exits with an error, ddprun restarts the group.
  static void withdraw();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<ProcessGroup> group_;
  int id_ = 0;
  bool joined_late_ = false;
  EpochChange change_;
};

}  // namespace ddp
