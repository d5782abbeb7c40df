#pragma once
// Where the trainer's math runs: an Engine holds the model, its loss and its
// optimizer, on the CPU (cpu_engine.cc: Mlp, loss.h and optimizer.h with
// OpenBLAS) or on a GPU (gpu_engine.cc: the same with cuBLAS and CUDA
// kernels). trainer.cc's loop, the gradient averaging and the checkpoints are the same for
// both; only the memory the pointers below point into differs (host memory,
// or device memory on the GPU, which GradSync reduces with NCCL).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data.h"
#include "ddp/grad_averager.h"
#include "ddp/params.h"
#include "flags.h"
#include "loss.h"
#include "mlp.h"

namespace train {

class Engine {
 public:
  virtual ~Engine() = default;

  // "the CPU (OpenBLAS, Haswell kernels, 1 thread)", "cuda:0 (NVIDIA H100 80GB HBM3), cuBLAS".
  virtual std::string description() const = 0;
  // The parameters for the gradient averaging (device >= 0 on the GPU).
  virtual std::vector<ddp::GradParam> grad_params() const = 0;

  // Forward pass, loss and dLoss/dOutputs of one batch (any size). `peers`
  // (may be null): the CPU engine asks it check_peers() within a large
  // layer's pass (Mlp::forward); on a GPU the pass is only enqueued.
  virtual void forward(const Batch& batch, ddp::ProcessGroup* peers) = 0;
  // The loss of the last forward(). On a GPU it waits for it: ask after backward().
  virtual LossResult loss() = 0;
  // As Mlp::backward: gradients into sync, scaled, stored or added.
  // `accumulate`: this micro-step adds to the window's earlier ones (the GPU
  // engine's views; the CPU engine's contribute() blocks say it themselves).
  virtual void backward(ddp::GradAverager& sync, float scale, bool accumulate) = 0;
  // One optimizer step with the averaged gradients in sync's views.
  virtual void step(ddp::GradAverager& sync) = 0;

  // Collective: every rank gets rank 0's weights and optimizer state.
  virtual void prepare(ddp::GradAverager& sync) = 0;
  // Checkpoints: host buffers holding the weights, then the optimizer state
  // (optimizer.h's order), the same on both engines, so a checkpoint written
  // by one loads into the other. On the GPU they are copies made by this
  // call; after writing into them (load_checkpoint), call load_host_state().
  virtual std::vector<ddp::ParamBuffer> host_state() = 0;
  virtual void load_host_state() = 0;
  // Collective, before rank 0 reads host_state() for a checkpoint: with a
  // sharded optimizer, every rank's shard of the optimizer state is gathered
  // (the weights are whole on every rank after each step anyway).
  virtual void gather_state() {}
  // Live recovery (--on_failure=heal) with --shard_optimizer, on the CPU
  // engine (the others hold the whole state and have nothing to do; see
  // healing_shards.h). Collective: restore_shards() before every state sync
  // (HealParticipant::before_sync; `committed`: this member's committed steps,
  // -1 for a relaunch; returns the bytes the holders of shards sent);
  // shard_for_healing() once the group is settled.
  virtual std::uint64_t restore_shards(ddp::ProcessGroup& /*group*/, std::int64_t /*committed*/) {
    return 0;
  }
  virtual void shard_for_healing(ddp::ProcessGroup& /*group*/) {}
  // Whether this process holds the whole training state (what a checkpoint
  // needs); a sharded optimizer's may be spread over the ranks.
  virtual bool holds_whole_state() const { return true; }
};

// What both engines do alike, for a model with Mlp's interface and an
// optimizer with Optimizer's (Mlp and Optimizer, or their GPU twins).
//
// Each parameter's element count (what the optimizer is built from).
template <typename Model>
std::vector<std::size_t> param_counts(const Model& model) {
  std::vector<std::size_t> counts;
  for (std::size_t p = 0; p < model.num_tensors(); ++p) counts.push_back(model.count(p));
  return counts;
}
// Where each parameter's values are (GradAverager::prepare's param_data).
template <typename Model>
std::vector<void*> param_pointers(Model& model) {
  std::vector<void*> pointers;
  for (std::size_t p = 0; p < model.num_tensors(); ++p) pointers.push_back(model.data(p));
  return pointers;
}
// One optimizer step over every parameter, with the averaged gradients.
template <typename Model, typename Opt>
void optimizer_step(Model& model, Opt& opt, ddp::GradAverager& sync) {
  opt.begin_step();
  for (std::size_t p = 0; p < model.num_tensors(); ++p)
    opt.update(p, model.data(p), sync.grad_view(p));
}
// The weights, then the optimizer's state: a checkpoint's buffers.
template <typename Model, typename Opt>
std::vector<ddp::ParamBuffer> model_and_optimizer_state(Model& model, Opt& opt) {
  std::vector<ddp::ParamBuffer> buffers;
  for (std::size_t p = 0; p < model.num_tensors(); ++p)
    buffers.push_back({model.data(p), model.count(p), ddp::DType::kFloat32});
  for (const auto& b : opt.state()) buffers.push_back(b);
  return buffers;
}

// `draw_weights` false: the weights start at zero (they are about to be
// received, as in a rank relaunched under --on_failure=heal).
// `state_memory`, when set, gives the zeroed memory (of the bytes asked)
// that holds the weights and the optimizer's buffers: ddp::Healer::state_memory,
// which a relaunch inherits with its pages. Not with --shard_optimizer,
// whose weights live in the shards.
using StateMemory = std::function<std::shared_ptr<void>(std::size_t bytes)>;
std::unique_ptr<Engine> make_cpu_engine(const Config& config, const std::vector<int>& dims,
                                        bool draw_weights = true,
                                        const StateMemory& state_memory = nullptr);

// The GPU engine (--backend nccl), compiled only when the build found CUDA,
// cuBLAS and NCCL (see flags.h's gpu_path_missing()).
//
// "" when this process can compute on CUDA device `device` (its LOCAL_RANK),
// else why not, e.g. "no CUDA device is visible (cudaGetDeviceCount: ...)".
// The trainer asks before ddp::init(), then calls make_gpu_engine.
std::string gpu_problem(int device);
std::unique_ptr<Engine> make_gpu_engine(const Config& config, const std::vector<int>& dims,
                                        int device);

}  // namespace train
