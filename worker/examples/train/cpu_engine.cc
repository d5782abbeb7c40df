// The CPU engine: Mlp, loss.h and optimizer.h, with single-threaded OpenBLAS.

#include <cblas.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>

#include "ddp/param_shards.h"
#include "engine.h"
#include "optimizer.h"

namespace train {
namespace {

using Clock = std::chrono::steady_clock;

class CpuEngine final : public Engine {
 public:
  CpuEngine(const Config& c, const std::vector<int>& dims) : config_(c), model_(dims, c.seed) {
    openblas_set_num_threads(1);
    opt_ = make_optimizer(c, param_counts());
  }

  std::string description() const override {
    return std::string("the CPU (OpenBLAS, ") + openblas_get_corename() + " kernels, 1 thread)";
  }
  const std::vector<int>& dims() const override { return model_.dims(); }
  std::size_t num_elements() const override { return model_.num_elements(); }
  std::vector<ddp::GradParam> grad_params() const override {
    std::vector<ddp::GradParam> params = model_.grad_params();
    // The activation exchange sums the gradients itself, in its own memory:
    // GradSync only checks and broadcasts the parameters, and holds no buckets.
    if (config_.exchange == "activations") {
      for (ddp::GradParam& p : params) p.requires_grad = false;
    }
    return params;
  }

  void forward(const Batch& batch) override {
    // The last micro-batch's gradient rows, before this one overwrites this
    // rank's inputs and output gradients, which the others may still read.
    if (pending_) {
      weight_rows(nullptr);
      wait_for_all();
    }
    float* out = model_.forward(batch.x.data(), batch.size);
    loss_ = config_.task == Task::kClassification
                ? cross_entropy(out, batch.labels.data(), batch.size, config_.output_dim,
                                model_.output_grad())
                : mean_squared_error(out, batch.y.data(), batch.size, config_.output_dim,
                                     model_.output_grad());
  }
  LossResult loss() override { return loss_; }
  void backward(GradSink& sink, float scale, bool accumulate) override {
    if (!exchange_) return model_.backward(sink, scale, accumulate);
    const auto start = Clock::now();
    model_.backward_chain();
    backward_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    ++backwards_;
    // The weight gradients follow in the next forward() or in step(), which
    // also updates the weights: claimed unit by unit, balanced across ranks.
    pending_ = Pending{scale, accumulate};
  }
  void step(ddp::GradSync& sync) override {
    if (exchange_) {
      // Every unit's rows updated as soon as they are summed, then everyone's
      // rows are in place before anyone's next forward.
      opt_->begin_step();
      const std::vector<int>& dims = model_.dims();
      weight_rows([&](const ExchangeUnit& unit, const float* weight_rows, const float* bias_rows) {
        const std::size_t weight = 2 * static_cast<std::size_t>(unit.layer), bias = weight + 1;
        const auto width = static_cast<std::size_t>(dims[unit.layer]);
        const auto begin = static_cast<std::size_t>(unit.rows.begin);
        const auto end = static_cast<std::size_t>(unit.rows.end);
        opt_->update_elements(weight, model_.data(weight), weight_rows, begin * width, end * width);
        opt_->update_elements(bias, model_.data(bias), bias_rows, begin, end);
      });
      wait_for_all();
      return;
    }
    if (!shards_) return optimizer_step(model_, *opt_, sync);
    // ZeRO stage 1: this rank's elements only, then everyone's to everyone.
    opt_->begin_step();
    for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
      const ddp::ElementRange mine = shards_->owned(p);
      if (!mine.empty())
        opt_->update_range(p, model_.data(p), sync.grad_view(p), mine.begin, mine.end);
    }
    shards_->all_gather();
  }
  bool exchanges_activations() const override { return exchange_ != nullptr; }
  std::optional<ExchangeStats> exchange_stats() const override {
    if (!exchange_) return std::nullopt;
    ExchangeStats stats;
    stats.backwards = backwards_;
    const double n = backwards_ > 0 ? static_cast<double>(backwards_) : 1.0;
    stats.backward_ms = backward_ms_ / n;
    stats.waited_ms = exchange_->waited_ms() / n;
    stats.bytes_per_backward = exchange_->exchanged_bytes();
    stats.units_taken = static_cast<double>(units_taken_) / n;
    stats.units = static_cast<int>(units_.size());
    return stats;
  }

  void prepare(ddp::GradSync& sync) override {
    sync.prepare(model_.data_pointers(), opt_->state());
    if (config_.exchange == "activations" && !exchange_) {
      exchange_ = std::make_unique<ExchangeMemory>(sync.group(), param_counts(),
                                                   opt_->state_groups(), model_.dims(),
                                                   config_.batch_size);
      // The weights and the optimizer's state: one copy for the node, filled by rank 0.
      const bool fill = !exchange_->shared() || sync.group().rank() == 0;
      opt_->bind_state(exchange_->state(), fill);
      move_weights(exchange_->params(), exchange_->shared(), sync.group());
      model_.bind_exchange(&exchange_->blocks());
      units_ = exchange_units(model_.dims(), sync.group().size(), kMinUnitRows);
    }
    if (config_.shard_optimizer && !shards_) {
      // The weights move into the shards' buffer (with shm one copy for the node).
      shards_ = std::make_unique<ddp::ParamShards>(sync.group(), model_.grad_params());
      std::vector<float*> views;
      for (std::size_t p = 0; p < model_.num_tensors(); ++p) views.push_back(shards_->view(p));
      move_weights(views, shards_->node_shared(), sync.group());
      // The step reads only the gradient elements this rank owns: the others
      // need not be reduced here (ZeRO stage 2's reduce-scatter).
      std::vector<ddp::ElementRange> owned;
      for (std::size_t p = 0; p < model_.num_tensors(); ++p) owned.push_back(shards_->owned(p));
      sync.set_needed_gradients(std::move(owned));
    }
  }
  void gather_state() override {
    if (!shards_) return;  // the exchange's state is one copy for the node already
    for (const auto& group : opt_->param_shaped_state()) shards_->all_gather(group);
  }
  // The live buffers themselves: loading writes straight into the model.
  std::vector<ddp::ParamBuffer> host_state() override {
    return model_and_optimizer_state(model_, *opt_);
  }
  void load_host_state() override {}

 private:
  std::vector<std::size_t> param_counts() const {
    std::vector<std::size_t> counts;
    for (std::size_t p = 0; p < model_.num_tensors(); ++p) counts.push_back(model_.count(p));
    return counts;
  }
  // The weights move into `storage` (count(p) floats per parameter). When it
  // is one copy for the whole node, rank 0 fills it (every rank holds rank
  // 0's weights by now) and the others wait for that before computing.
  void move_weights(const std::vector<float*>& storage, bool node_wide, ddp::ProcessGroup& group) {
    model_.bind(storage, !node_wide || group.rank() == 0);
    if (node_wide) group.barrier();
  }
  void wait_for_all() { exchange_->blocks().wait_for_all(); }
  // The pending micro-batch's weight gradient units (row_exchange.h), this
  // rank's share of them, timed into backward_ms_.
  void weight_rows(const Mlp::UnitUpdate& update) {
    const auto start = Clock::now();
    units_taken_ += model_.weight_rows(units_, exchange_->grads(), pending_->scale,
                                       pending_->accumulate, update);
    pending_.reset();
    backward_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  }

  Config config_;
  Mlp model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<ddp::ParamShards> shards_;  // with --shard_optimizer, after prepare()
  // --exchange activations, after prepare(): the node-wide memory, the units
  // of the weight gradients, and the micro-batch whose units are still to do.
  struct Pending {
    float scale;
    bool accumulate;
  };
  // Units of fewer rows cost more per row (the GEMM repacks the inputs per
  // call): 64 rows took 11% longer than 512 here.
  static constexpr int kMinUnitRows = 64;
  std::unique_ptr<ExchangeMemory> exchange_;
  std::vector<ExchangeUnit> units_;
  std::optional<Pending> pending_;
  std::int64_t units_taken_ = 0;
  double backward_ms_ = 0;
  std::int64_t backwards_ = 0;
  LossResult loss_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Config& config, const std::vector<int>& dims) {
  return std::make_unique<CpuEngine>(config, dims);
}

}  // namespace train
