#pragma once
// The model: a multi-layer perceptron, Linear -> ReLU -> ... -> Linear, with
// forward and backward on the CPU through OpenBLAS (row-major sgemm).
//
// Parameters are numbered like torch's named_parameters(): layer l's weight
// [out x in] is index 2l ("fc{l+1}.weight"), its bias [out] index 2l+1
// ("fc{l+1}.bias"). The backward pass visits layers last to first and hands
// each gradient to a GradSink as soon as it is computed: bias, then weight,
// then the gradient flows on to the layer below. With GradSync behind the
// sink, a bucket's all-reduce starts while the lower layers are still being
// differentiated.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/grad_sync.h"
#include "row_exchange.h"

namespace train {

// Where backward puts gradients.
class GradSink {
 public:
  virtual ~GradSink() = default;
  // count(param) floats for param's gradient, valid until ready(param).
  virtual float* grad(std::size_t param) = 0;
  // param's gradient is complete.
  virtual void ready(std::size_t param) = 0;
  // true: gradients are handed over with contribute() instead (GradSync's
  // shared sum), block of rows by block of rows.
  virtual bool sums_in_place() const { return false; }
  // write(block) must store (block.accumulate false) or add (true) the
  // block's rows of param's gradient at block.data; the parameter is then complete.
  virtual void contribute(std::size_t param,
                          const std::function<void(const ddp::GradBlock&)>& write) {
    (void)param;
    (void)write;
    throw ddp::Error("GradSink: this sink does not sum in place");
  }
};

class Mlp {
 public:
  // dims = {input, hidden..., output} (at least two entries). Weights and
  // biases start uniform in +-1/sqrt(fan_in), as torch's nn.Linear does,
  // drawn from `seed`.
  Mlp(std::vector<int> dims, std::uint64_t seed);

  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  int input_dim() const { return dims_.front(); }
  int output_dim() const { return dims_.back(); }
  const std::vector<int>& dims() const { return dims_; }

  // Parameter tensors (2 per layer) and their element counts.
  std::size_t num_tensors() const { return tensors_.size(); }
  std::size_t count(std::size_t param) const { return tensors_[param].size(); }
  std::size_t num_elements() const;
  float* data(std::size_t param) { return data_[param]; }
  std::vector<void*> data_pointers();
  // Moves the parameters into storage[p] (count(p) floats each, owned by the
  // caller and outliving the model, e.g. ddp::ParamShards' views): the
  // current values are copied there (unless `copy` is false: another rank
  // fills memory that several ranks share) and every later use reads them there.
  void bind(const std::vector<float*>& storage, bool copy = true);
  // Names and shapes, for GradSync (and its cross-rank check).
  std::vector<ddp::GradParam> grad_params() const;

  // Runs the model on `batch` rows of `x` (batch x input_dim). Returns the
  // outputs (batch x output_dim), valid until the next forward. `x` must stay
  // unchanged until backward() returns.
  float* forward(const float* x, int batch);
  // The buffer (batch x output_dim) the loss writes dLoss/dOutputs into;
  // call it after forward(), which sizes it (before the first, it is null).
  float* output_grad();
  // Back-propagates output_grad() through the last forward. Each gradient is
  // scale * dLoss/dParam, written (accumulate = false) or added (true) into
  // sink.grad(p), then sink.ready(p) is called. With sink.sums_in_place(),
  // each gradient goes to sink.contribute() instead, each block of rows set
  // or added to as the block says (`accumulate` is then the sum's business).
  void backward(GradSink& sink, float scale, bool accumulate);

  // The activation exchange (row_exchange.h). After bind_exchange(blocks),
  // forward() leaves its input and every hidden layer's output in this rank's
  // rows of blocks->inputs, and output_grad() is this rank's rows of the last
  // layer's blocks->grads; every batch must have blocks->batch rows. `blocks`
  // (not owned) must outlive the model's use; nullptr goes back to private
  // buffers. Every rank of the blocks calls, per micro-batch: forward(), the
  // loss into output_grad(), backward_chain(), weight_rows(); and
  // blocks->wait_for_all() before its next forward() (others may still read
  // its rows) and before reading rows that others computed.
  void bind_exchange(const ExchangeBlocks* blocks);
  // Instead of backward(): this rank's output gradients of every layer,
  // published (blocks->publish) as they are written. Never waits.
  void backward_chain();
  // update(unit, weight_rows, bias_rows): the unit's gradient rows, row
  // unit.rows.begin first (weight: rows x dims[l] floats; bias: rows floats).
  using UnitUpdate =
      std::function<void(const ExchangeUnit& unit, const float* weight_rows, const float* bias_rows)>;
  // Collective over the blocks' ranks, after backward_chain(): claims units of
  // `units` (exchange_units()) until none is left; for each it computes scale
  // * the sum over EVERY rank's batch of dLoss/dParam for the unit's rows and
  // calls update() with them if given, once every rank is done reading the
  // unit's weights (the optimizer may then write them). The rows are written
  // (accumulate: added) into grads[2l] and grads[2l+1] (parameter p's buffer,
  // count(p) floats, in memory every rank maps), except with an update and
  // without accumulate: then nothing else reads them, and they go to a buffer
  // of this rank's instead (grads is left as it was). Waits only for data it
  // needs (blocks->wait_for_published). Returns the number of units this
  // rank took.
  int weight_rows(const std::vector<ExchangeUnit>& units, const std::vector<float*>& grads,
                  float scale, bool accumulate, const UnitUpdate& update = nullptr);

 private:
  std::vector<int> dims_;
  std::vector<std::vector<float>> tensors_;  // the parameters' own storage, until bind()
  std::vector<float*> data_;                 // where each parameter's values are
  int batch_ = 0;
  const float* x_ = nullptr;
  std::vector<std::vector<float>> act_;  // act_[l]: output of layer l (post-ReLU for hidden)
  std::vector<float*> out_;              // where the last forward put each layer's output
  std::vector<float> dz_, dz_next_, ones_;
  const ExchangeBlocks* exchange_ = nullptr;
  std::int64_t chains_ = 0;       // backward_chain() calls since bind_exchange()
  std::int64_t rows_done_ = 0;    // weight_rows() calls since bind_exchange()
  std::vector<float> unit_grads_;  // weight_rows(): a unit's gradient rows that only its update reads
};

}  // namespace train
