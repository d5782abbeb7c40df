// The CPU engine: Mlp, loss.h and optimizer.h, with single-threaded OpenBLAS.

#include <cblas.h>

#include "ddp/param_shards.h"
#include "engine.h"
#include "float_mode.h"
#include "healing_shards.h"
#include "optimizer.h"

namespace train {
namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(const Config& c, const std::vector<int>& dims, bool draw_weights,
            const StateMemory& state_memory)
      : config_(c),
        memory_(state_memory ? state_memory(state_bytes(c, dims)) : nullptr),
        model_(dims, c.seed, draw_weights, floats_at(0)),
        opt_(c, Mlp::param_counts(dims), floats_at(Mlp::param_floats(dims))) {
    openblas_set_num_threads(1);
  }

  std::string description() const override {
    return std::string("the CPU (OpenBLAS, ") + openblas_get_corename() + " kernels, 1 thread" +
           (denormals_flushed() ? ", denormals flushed to zero)" : ")");
  }
  std::vector<ddp::GradParam> grad_params() const override { return model_.grad_params(); }

  void forward(const Batch& batch, ddp::ProcessGroup* peers) override {
    float* out = model_.forward(batch.x.data(), batch.size, peers);
    loss_ = config_.task == Task::kClassification
                ? cross_entropy(out, batch.labels.data(), batch.size, config_.output_dim,
                                model_.output_grad())
                : mean_squared_error(out, batch.y.data(), batch.size, config_.output_dim,
                                     model_.output_grad());
  }
  LossResult loss() override { return loss_; }
  // The averager says whether a micro-step stores or adds (GradBlock::accumulate).
  void backward(ddp::GradAverager& sync, float scale, bool /*accumulate*/) override {
    model_.backward(sync, scale);
  }
  void step(ddp::GradAverager& sync) override {
    if (healing_) return healing_->step(sync);
    if (!shards_) return optimizer_step(model_, opt_, sync);
    // ZeRO stage 1: this rank's elements only, then everyone's to everyone.
    opt_.begin_step();
    for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
      const ddp::ElementRange mine = shards_->owned(p);
      if (!mine.empty())
        opt_.update_range(p, model_.data(p), sync.grad_view(p), mine.begin, mine.end);
    }
    shards_->all_gather();
  }

  void prepare(ddp::GradAverager& sync) override {
    sync.prepare(param_pointers(model_), opt_.state());
    if (!config_.shard_optimizer || shards_) return;
    // The weights move into the shards' buffer. With shm it is one copy for
    // the node: rank 0 fills it (every rank holds rank 0's weights by now)
    // and the others wait for that before computing.
    ddp::ProcessGroup& group = sync.group();
    shards_ = std::make_unique<ddp::ParamShards>(group, model_.grad_params());
    std::vector<float*> views;
    for (std::size_t p = 0; p < model_.num_tensors(); ++p) views.push_back(shards_->view(p));
    model_.bind(views, !shards_->node_shared() || group.rank() == 0);
    if (shards_->node_shared()) group.barrier();
    // The step reads only the gradient elements this rank owns: the others
    // need not be reduced here (ZeRO stage 2's reduce-scatter).
    std::vector<ddp::ElementRange> owned;
    for (std::size_t p = 0; p < model_.num_tensors(); ++p) owned.push_back(shards_->owned(p));
    sync.set_needed_gradients(std::move(owned));
  }
  void gather_state() override {
    if (healing_) return healing_->gather();
    if (!shards_) return;
    for (const auto& group : opt_.param_shaped_state()) shards_->all_gather(group);
  }
  // The live buffers themselves: loading writes straight into the model.
  std::vector<ddp::ParamBuffer> host_state() override {
    return model_and_optimizer_state(model_, opt_);
  }
  void load_host_state() override {}

  std::uint64_t restore_shards(ddp::ProcessGroup& group, std::int64_t committed) override {
    return healing() ? healing_->restore(group, committed) : 0;
  }
  void shard_for_healing(ddp::ProcessGroup& group) override {
    if (healing()) healing_->shard(group);
  }
  bool holds_whole_state() const override { return !healing_ || healing_->whole(); }

 private:
  // The weights, then the optimizer's buffers, in one block.
  static std::size_t state_bytes(const Config& c, const std::vector<int>& dims) {
    const std::size_t weights = Mlp::param_floats(dims);
    return (weights + Optimizer::state_floats(c, Mlp::param_counts(dims))) * sizeof(float);
  }
  float* floats_at(std::size_t offset) const {
    return memory_ ? static_cast<float*>(memory_.get()) + offset : nullptr;
  }

  Config config_;
  std::shared_ptr<void> memory_;  // the state's memory when the caller gave one
  Mlp model_;
  Optimizer opt_;
  // With --shard_optimizer: the heal loop's shards (HealingShards), made on
  // its first call; else the plain loop's, after prepare().
  bool healing() {
    if (config_.shard_optimizer && !healing_)
      healing_ = std::make_unique<HealingShards>(model_, opt_);
    return healing_ != nullptr;
  }
  std::unique_ptr<HealingShards> healing_;
  std::unique_ptr<ddp::ParamShards> shards_;
  LossResult loss_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Config& config, const std::vector<int>& dims,
                                        bool draw_weights, const StateMemory& state_memory) {
  return std::make_unique<CpuEngine>(config, dims, draw_weights,
                                     config.shard_optimizer ? nullptr : state_memory);
}

}  // namespace train
