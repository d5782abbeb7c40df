// The CPU engine: Mlp, loss.h and optimizer.h, with single-threaded OpenBLAS.

#include <cblas.h>

#include <chrono>
#include <cstring>

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

  std::string description() const override { return "the CPU (OpenBLAS, 1 thread)"; }
  const std::vector<int>& dims() const override { return model_.dims(); }
  std::size_t num_elements() const override { return model_.num_elements(); }
  std::vector<ddp::GradParam> grad_params() const override { return model_.grad_params(); }

  void forward(const Batch& batch) override {
    // The next micro-batch overwrites this rank's rows: not while others read them.
    if (rows_in_use_) wait_for_all();
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
    model_.backward_rows(row_grads_, scale, accumulate);
    rows_in_use_ = true;
    backward_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    ++backwards_;
  }
  void step(ddp::GradSync& sync) override {
    if (exchange_) {
      // This rank's rows, then everyone's rows are in place before anyone's next forward.
      opt_->begin_step();
      for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
        const ddp::ElementRange mine = owned(p);
        if (!mine.empty())
          opt_->update_range(p, model_.data(p), row_grads_[p], mine.begin, mine.end);
      }
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
    return stats;
  }

  void prepare(ddp::GradSync& sync) override {
    sync.prepare(model_.data_pointers(), opt_->state());
    if (config_.exchange == "activations" && !exchange_) {
      exchange_ = std::make_unique<ExchangeMemory>(sync.group(), param_counts(), model_.dims(),
                                                   config_.batch_size);
      move_weights(exchange_->params(), exchange_->shared(), sync.group());
      model_.bind_exchange(&exchange_->blocks());
      // Only this rank's rows are ever written: the rest stays untouched (unallocated pages).
      for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
        row_grad_storage_.emplace_back(new float[model_.count(p)]);
        row_grads_.push_back(row_grad_storage_.back().get());
      }
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
    group_ = &sync.group();
  }
  void gather_state() override {
    if (exchange_) return gather_rows();
    if (!shards_) return;
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
  void wait_for_all() {
    exchange_->blocks().wait_for_all();
    rows_in_use_ = false;
  }
  ddp::ElementRange owned(std::size_t param) const {
    return owned_elements(model_.dims(), param, group_->size(), group_->rank());
  }
  // Every rank's rows of the optimizer's state to every rank: a sum of
  // buffers that are zero outside their owner's rows (x + 0 is exact).
  void gather_rows() {
    for (const auto& buffers : opt_->param_shaped_state()) {
      std::vector<float> all(model_.num_elements(), 0.0f);
      std::size_t at = 0;
      for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
        const ddp::ElementRange mine = owned(p);
        const float* state = static_cast<const float*>(buffers[p]);
        std::memcpy(all.data() + at + mine.begin, state + mine.begin, mine.size() * sizeof(float));
        at += model_.count(p);
      }
      group_->all_reduce(all.data(), all.size(), ddp::DType::kFloat32, ddp::ReduceOp::kSum);
      at = 0;
      for (std::size_t p = 0; p < model_.num_tensors(); ++p) {
        std::memcpy(buffers[p], all.data() + at, model_.count(p) * sizeof(float));
        at += model_.count(p);
      }
    }
  }

  Config config_;
  Mlp model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<ddp::ParamShards> shards_;  // with --shard_optimizer, after prepare()
  ddp::ProcessGroup* group_ = nullptr;        // after prepare()
  // --exchange activations, after prepare(): the node-wide memory and this
  // rank's rows of each gradient (row_grads_[p] has count(p) floats).
  std::unique_ptr<ExchangeMemory> exchange_;
  std::vector<std::unique_ptr<float[]>> row_grad_storage_;
  std::vector<float*> row_grads_;
  bool rows_in_use_ = false;  // other ranks may be reading this rank's rows
  double backward_ms_ = 0;
  std::int64_t backwards_ = 0;
  LossResult loss_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Config& config, const std::vector<int>& dims) {
  return std::make_unique<CpuEngine>(config, dims);
}

}  // namespace train
