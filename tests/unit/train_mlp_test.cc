// The reference trainer's model (examples/train/mlp.h): its backward pass
// stops at the next layer once a peer of the group is known gone, instead
// of differentiating every layer of a step that can no longer commit.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ddp/grad_sync.h"
#include "ddp/process_group.h"
#include "ddp/store.h"
#include "mlp.h"

namespace train {
namespace {

using namespace std::chrono_literals;

TEST(MlpBackward, StopsAtTheNextLayerOnceAPeerLeftTheGroup) {
  const std::vector<int> dims = {4, 8, 8, 2};  // three layers
  const auto store = ddp::make_memory_store();
  // Two members, each a thread standing for a node of its own (so that a
  // departure is asked of the store): both make their group and GradSync
  // (collective).
  Mlp mine(dims, 1), theirs(dims, 1);
  auto join = [&](int rank, Mlp& model) {
    return std::async(std::launch::async, [&, rank] {
      ddp::ProcessGroupOptions options = ddp::ProcessGroupOptions::of("gloo");
      options.timeout = 20s;
      options.local_size = 1;
      options.node = rank;
      options.nodes = 2;
      auto group = ddp::ProcessGroup::create(rank, 2, store, options);
      return std::make_unique<ddp::GradSync>(group, model.grad_params());
    });
  };
  auto other = join(1, theirs);
  std::unique_ptr<ddp::GradSync> sync = join(0, mine).get();
  std::unique_ptr<ddp::GradSync> gone = other.get();
  gone->group().abort();  // member 1 leaves, as a survivor of a failure does
  gone.reset();

  const std::vector<float> x(2 * 4, 0.5f);
  mine.forward(x.data(), 2);
  for (int i = 0; i < 2 * 2; ++i) mine.output_grad()[i] = 0.25f;
  sync->begin_backward();
  try {
    mine.backward(*sync, 1.0f);
    FAIL() << "the backward pass must stop once member 1 left";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a peer is gone: rank 1 left the group"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(sync->finish(), ddp::Error);  // its all-reduce cannot complete either
}

}  // namespace
}  // namespace train
