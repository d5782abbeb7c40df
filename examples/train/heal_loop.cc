// The trainer's loop under live recovery. A step is committed once this
// rank's finish() returned and it applied the optimizer update; a step whose
// collectives failed is dropped on this rank (nothing applied) and the next
// ddp::Healer::settle() rebuilds the group and makes every member hold the most
// advanced member's state: a step that some survivor committed is kept (its
// gradient sum was whole: every rank had contributed), one that nobody
// committed is redone with the new group.

#include "heal_loop.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include <unistd.h>

#include <fmt/ranges.h>

#include "checkpoint.h"
#include "ddp/ddp.h"
#include "ddp/heal.h"
#include "ddp/log.h"
#include "elastic_plan.h"
#include "engine.h"

namespace train {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// FNV-1a over the bytes of the first `n` buffers (the weights).
std::uint64_t checksum(const std::vector<ddp::ParamBuffer>& buffers, std::size_t n) {
  std::uint64_t h = 14695981039346656037ull;
  for (std::size_t i = 0; i < n && i < buffers.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(buffers[i].data);
    const std::size_t bytes = buffers[i].count * ddp::dtype_size(buffers[i].dtype);
    for (std::size_t k = 0; k < bytes; ++k) h = (h ^ p[k]) * 1099511628211ull;
  }
  return h;
}

// --sample_log: one line per committed step this process knows of.
class SampleLog {
 public:
  SampleLog(const std::string& path, int id) {
    if (path.empty()) return;
    const std::string file = path + "." + std::to_string(id) + "." + std::to_string(::getpid());
    file_ = std::fopen(file.c_str(), "a");
    if (file_ == nullptr) throw ddp::Error("--sample_log: cannot open " + file);
  }
  ~SampleLog() {
    if (file_ != nullptr) std::fclose(file_);
  }
  void step(std::int64_t step, const Position& at, std::int64_t count) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "step %" PRId64 " epoch %" PRId64 " offset %" PRId64 " count %" PRId64 "\n",
                 step, at.epoch, at.offset, count);
    std::fflush(file_);
  }

 private:
  std::FILE* file_ = nullptr;
};

// Who sent the state: "nobody", "rank 0", or "ranks 0 1 2 (striped)".
std::string senders(const ddp::HealReport& report) {
  if (report.donors.empty()) return "nobody";
  if (report.donors.size() == 1) return fmt::format("rank {}", report.donors.front());
  return fmt::format("ranks {} (striped)", fmt::join(report.donors, " "));
}

class HealingTrainer {
 public:
  HealingTrainer(const Config& c, const Data& data, const std::vector<int>& dims,
                 const std::string& backend, const Hooks& hooks)
      : c_(c),
        hooks_(hooks),
        data_(data),
        model_(fmt::format("{}", fmt::join(dims, "-"))),
        plan_(data.train.size(), c.batch_size, c.accumulate, c.seed),
        // The Healer forms the first epoch, or a relaunched rank asks to be
        // admitted, while the model is allocated (1.6 s for 1 GiB of fresh
        // memory on a busy machine, 0.2 s inherited): the survivors can then
        // admit the relaunch in the reform that drops its predecessor. A
        // relaunched rank's values come from a live peer, so it draws none.
        starting_(ddp::Healer::start(init_options(backend))),
        engine_(make_engine(c, dims, backend, hooks)),
        healer_(starting_.get()),
        log_(c.sample_log, healer_->id()) {
    committed_ = healer_->joined_late() ? -1 : 0;
    if (healer_->group()) constructed_epoch_ = healer_->group()->epoch();
    if (healer_->group() && !healer_->joined_late() && !c.resume.empty()) resume();
  }

  int run();

 private:
  static std::unique_ptr<Engine> make_engine(const Config& c, const std::vector<int>& dims,
                                             const std::string& backend, const Hooks& hooks) {
    if (hooks.before_model) hooks.before_model();
    // On the GPU the relaunch draws weights too (a kernel, cheap), then receives them.
    if (backend == "nccl") return make_gpu_engine(c, dims, ddp::local_rank());
    // The state lives in memory that a relaunch of this rank inherits, pages
    // made; a relaunch's first settle() overwrites it all, so it is not zeroed.
    const bool relaunched = ddp::Healer::relaunched();
    const auto fill =
        relaunched ? ddp::Healer::StateFill::kUnspecified : ddp::Healer::StateFill::kZeros;
    return make_cpu_engine(c, dims, !relaunched, [fill](std::size_t bytes) {
      return ddp::Healer::state_memory(bytes, fill);
    });
  }
  static ddp::InitOptions init_options(const std::string& backend) {
    ddp::InitOptions init;
    init.backend = backend;
    return init;
  }
  std::int64_t total_steps() const { return c_.steps > 0 ? c_.steps : -1; }
  bool done() const {
    return c_.steps > 0 ? committed_ >= c_.steps : position_.epoch >= std::max<long>(c_.epochs, 1);
  }
  ddp::HealParticipant participant();
  void rebuild(ddp::ProcessGroup& g, const ddp::Settlement& s);
  void train_step();
  std::vector<ddp::ParamBuffer> state();
  CheckpointMeta describe() const;
  void resume();
  void save(const char* why);
  int give_up(const ddp::HealError& e);
  void boundary();

  const Config& c_;
  const Hooks& hooks_;
  const Data& data_;
  const std::string model_;  // "32-128-128-10": what a checkpoint must have been written for
  ElasticPlan plan_;
  std::future<std::unique_ptr<ddp::Healer>> starting_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ddp::Healer> healer_;
  SampleLog log_;
  std::unique_ptr<ddp::GradAverager> sync_;
  std::int64_t committed_ = 0;  // steps applied (-1: none yet, this process just joined)
  Position position_;
  int step_world_ = 0;                   // the group's size when the step in flight began
  std::uint64_t constructed_epoch_ = 0;  // the epoch the Healer formed or joined
  // This rank's count and data position when the last state sync began.
  std::int64_t mine_ = 0;
  Position was_;
  // The last state sync's optimizer shards, for its report.
  std::uint64_t shard_bytes_ = 0;
  double restore_ms_ = 0;
  Clock::time_point failed_at_{};
  Batch batch_;
  bool recovering_ = false;  // after a failure, until the next committed step
};

// What the Healer calls back: drop the GradSync (it holds the group), the
// state every member must hold alike, and the sharded optimizer's survivors
// rebuilding their whole state before it is compared.
ddp::HealParticipant HealingTrainer::participant() {
  ddp::HealParticipant p;
  p.release = [this] { sync_.reset(); };
  p.state = [this] { return state(); };
  p.rebuild = [this](ddp::ProcessGroup& g, const ddp::Settlement& s) { rebuild(g, s); };
  p.before_sync = [this](ddp::ProcessGroup& g, std::int64_t committed) {
    if (g.epoch() != constructed_epoch_ && hooks_.after_reform) hooks_.after_reform();
    mine_ = committed;
    was_ = position_;
    const Clock::time_point restoring = Clock::now();
    shard_bytes_ = engine_->restore_shards(g, committed);
    restore_ms_ = ms_since(restoring);
  };
  return p;
}

// After the Healer synced the state over a new group: check and log what
// came of the step in flight, then build the GradSync over the group.
// A broken invariant is not a ddp::Error: the Healer would take it for a
// dead peer and heal again.
void HealingTrainer::rebuild(ddp::ProcessGroup& g, const ddp::Settlement& s) {
  const std::int64_t mine = mine_;
  const Position was = was_;
  committed_ = s.committed;
  engine_->load_host_state();
  // A step this rank failed in but another committed: its samples were summed.
  if (mine >= 0 && committed_ == mine + 1) {
    const Position next = plan_.after(was, step_world_);
    if (next.epoch != position_.epoch || next.offset != position_.offset) {
      throw std::logic_error("heal: the donor's data position does not follow this rank's");
    }
    log_.step(mine, was, plan_.step_samples(was, step_world_));
  } else if (mine >= 0 && committed_ != mine) {
    throw std::logic_error("heal: this rank is " + std::to_string(committed_ - mine) +
                           " steps behind the donor (at most 1 is possible)");
  }
  sync_ = ddp::make_grad_averager(healer_->group(), engine_->grad_params(), grad_sync_options(c_));
  engine_->shard_for_healing(g);
  const double mb = static_cast<double>(s.report.bytes) / 1e6;
  if (s.before) {
    auto ids = [](const std::vector<int>& v) {
      return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, " "));
    };
    ddp::log::info_all(
        "heal: epoch {}: left {} | arrived {} | replaced {} | world {} -> {} | resumed at "
        "committed step {} | survivors waited {:.1f} ms | heal {:.1f} ms, {:.2f} MB from {}{}",
        g.epoch(), ids(s.change.left), ids(s.change.arrived), ids(s.change.replaced),
        s.before->size(), g.size(), committed_, s.reform_seconds * 1e3, s.report.seconds * 1e3, mb,
        senders(s.report),
        shard_bytes_ == 0
            ? std::string()
            : fmt::format(" | optimizer shards restored first: {:.2f} MB in {:.1f} ms",
                          static_cast<double>(shard_bytes_) / 1e6, restore_ms_));
  } else if (mine < 0) {
    ddp::log::info_all(
        "heal: joined epoch {} as rank {} of {} | received {:.2f} MB (state at committed step {}) "
        "in {:.1f} ms{}",
        g.epoch(), g.rank(), g.size(), mb, committed_, s.report.seconds * 1e3,
        s.report.read_directly
            ? fmt::format(" | read straight from rank {}'s state memory", s.report.donor)
            : std::string());
  }
  if (hooks_.after_settle) hooks_.after_settle();
}

void HealingTrainer::train_step() {
  ddp::ProcessGroup& g = *healer_->group();
  step_world_ = g.size();
  const std::int64_t samples = plan_.step_samples(position_, step_world_);
  for (int micro = 0; micro < c_.accumulate; ++micro) {
    auto slice = plan_.slice(position_, step_world_, g.rank(), micro);
    // An empty slice (an epoch's last step, fewer samples than slices): one
    // sample weighted 0, so every rank hands over its gradients alike.
    const std::int64_t first = 0;
    data_.train.gather(slice.empty() ? std::span<const std::int64_t>(&first, 1) : slice, batch_);
    // A peer that died since the step began fails it within the forward
    // pass of a large layer, or here, not at its first all-reduce a backward
    // pass later (Mlp::backward asks between layers and pieces too).
    engine_->forward(batch_, &g);
    if (hooks_.after_forward) hooks_.after_forward(committed_ + 1);
    g.check_peers();
    // The step's mean: this slice's share, times 1/slice in the loss gradient.
    const float scale = static_cast<float>(slice.size()) / static_cast<float>(samples);
    std::optional<ddp::GradAverager::NoSync> no_sync;
    if (micro + 1 < c_.accumulate) no_sync.emplace(*sync_);
    sync_->begin_backward();
    engine_->backward(*sync_, scale, micro > 0);
    sync_->finish();
  }
  if (hooks_.before_update) hooks_.before_update(committed_ + 1);
  engine_->step(*sync_);
  log_.step(committed_, position_, samples);
  ++committed_;
  position_ = plan_.after(position_, step_world_);
  if (recovering_) {
    ddp::log::info_all("heal: step {} committed {:.1f} ms after the failure was seen", committed_,
                       ms_since(failed_at_));
    recovering_ = false;
  }
}

// At every step boundary: the Healer syncs the state the first time, heals
// after a failure, and admits processes waiting to join when some ask.
void HealingTrainer::boundary() { healer_->settle(committed_, participant()); }

int HealingTrainer::run() {
  if (!healer_->group()) return 0;  // the job finished before this rank was admitted
  ddp::log::info("train: live recovery (--on_failure=heal): {} rank(s) ({}), MLP {} | math on {}",
                 healer_->group()->size(), healer_->group()->backend_name(), model_,
                 engine_->description());
  for (;;) {
    try {
      boundary();
      if (done()) {
        // Every rank past its last step before anyone stops: a rank that
        // fails now redoes nothing (all committed), but must not be waited for.
        if (!c_.checkpoint.empty()) engine_->gather_state();  // a sharded optimizer's
        healer_->group()->barrier();
        break;
      }
      train_step();
      if (committed_ % c_.log_every == 0 || committed_ == total_steps()) {
        ddp::log::info("step {}{} | epoch {} | world {} | samples {} | loss {:.6f}", committed_,
                       c_.steps > 0 ? "/" + std::to_string(c_.steps) : "", position_.epoch + 1,
                       healer_->group()->size(),
                       position_.epoch * data_.train.size() + position_.offset,
                       engine_->loss().loss);
      }
      if (!c_.checkpoint.empty() && c_.checkpoint_every > 0 &&
          committed_ % c_.checkpoint_every == 0) {
        engine_->gather_state();  // collective: a sharded optimizer's state to everyone
        if (healer_->group()->rank() == 0) save("every --checkpoint_every steps");
      }
      if (hooks_.after_step) hooks_.after_step(committed_);
    } catch (const ddp::HealError& e) {
      return give_up(e);
    } catch (const ddp::Error& e) {
      ddp::log::warn("heal: step {} did not commit: {}", committed_, e.what());
      failed_at_ = Clock::now();
      recovering_ = true;
      if (hooks_.before_reform) hooks_.before_reform();
      healer_->step_failed();
    }
  }
  healer_->finish();
  if (!c_.checkpoint.empty() && healer_->group()->rank() == 0) save("at the end");
  const std::vector<ddp::ParamBuffer> held = engine_->host_state();
  ddp::log::info_all("weights checksum: {:016x} | committed steps {} | epoch {} offset {}",
                     checksum(held, engine_->grad_params().size()), committed_, position_.epoch,
                     position_.offset);
  return 0;
}

// What every member must hold alike: the weights, the optimizer's state, the data position.
std::vector<ddp::ParamBuffer> HealingTrainer::state() {
  std::vector<ddp::ParamBuffer> buffers = engine_->host_state();
  buffers.push_back({&position_, 2, ddp::DType::kInt64});
  return buffers;
}

CheckpointMeta HealingTrainer::describe() const {
  return {{"step", std::to_string(committed_)},
          {"epoch", std::to_string(position_.epoch)},
          {"offset", std::to_string(position_.offset)},
          {"model", model_},
          {"on_failure", "heal"}};
}

// --resume under heal: group rank 0 reads the checkpoint; the first settle()
// then hands its state to every member (the others hold nothing yet).
void HealingTrainer::resume() {
  const std::string path = c_.resume == "auto" ? c_.checkpoint : c_.resume;
  ddp::ProcessGroup& g = *healer_->group();
  std::string status = "fresh";
  if (g.rank() == 0 && (c_.resume != "auto" || std::filesystem::exists(path))) {
    try {
      const CheckpointMeta meta = load_checkpoint(path, state());
      if (meta.count("model") == 0 || meta.at("model") != describe().at("model")) {
        throw ddp::Error("checkpoint " + path + " was written for another model");
      }
      status = "ok " + meta.at("step");
    } catch (const std::exception& e) {
      status = std::string("error ") + e.what();
    }
  }
  g.broadcast_object(status, 0);
  if (status.rfind("error ", 0) == 0) throw ddp::Error("--resume: " + status.substr(6));
  if (status == "fresh") return;
  committed_ = g.rank() == 0 ? std::stoll(status.substr(3)) : -1;
  ddp::log::info("resumed from {} at step {} (epoch {} offset {})", path, committed_,
                 position_.epoch, position_.offset);
}

// Writes the checkpoint unless the file already holds a later step (another
// member that held more got there first).
void HealingTrainer::save(const char* why) {
  try {
    if (std::filesystem::exists(c_.checkpoint) &&
        std::stoll(read_checkpoint_meta(c_.checkpoint).at("step")) >= committed_) {
      return;
    }
  } catch (const std::exception&) {
    // Unreadable: overwrite it.
  }
  save_checkpoint(c_.checkpoint, describe(), state());
  ddp::log::debug("checkpoint {} at step {} ({})", c_.checkpoint, committed_, why);
}

// The heal cannot finish: save what this process holds, and let ddprun
// restart the group (from the checkpoint, with --resume auto).
int HealingTrainer::give_up(const ddp::HealError& e) {
  // A sharded optimizer's state is whole here only after a gather.
  const bool saved = !c_.checkpoint.empty() && committed_ >= 0 && engine_->holds_whole_state();
  if (saved) save("the heal could not finish");
  healer_->withdraw();
  ddp::log::error("{}: {}", e.what(),
                  saved ? "saved step " + std::to_string(committed_) + " in " + c_.checkpoint +
                              "; ddprun restarts the group"
                        : std::string("ddprun restarts the group"));
  return 1;
}

}  // namespace

int run_healing(const Config& c, const Data& data, const std::vector<int>& dims,
                const std::string& backend, const Hooks& hooks) {
  try {
    HealingTrainer trainer(c, data, dims, backend, hooks);
    return trainer.run();
  } catch (const std::exception& e) {
    // Not a failure a relaunch of this rank alone can mend: the group restarts.
    ddp::Healer::withdraw();
    ddp::log::error("train: {}", e.what());
    return 1;
  }
}

}  // namespace train
