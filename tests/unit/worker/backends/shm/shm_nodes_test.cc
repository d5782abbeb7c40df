// libddp's shm backend with ranks placed on simulated nodes (threads with a
// node name each): hierarchical all-reduce (shm within a node, Gloo among equal
// local ranks), Gloo across nodes of one rank or of different sizes, every
// collective against the reference and float sums bit for bit equal.

#include "shm_test_fixtures.h"

namespace ddp {
namespace {

using namespace ::ddp::shm_test;
using namespace std::chrono_literals;

// ---- Ranks on several (simulated) nodes: hierarchical all-reduce, Gloo fallback ----------

// Runs body on ranks placed on nodes of the given sizes (ranks of a node
// consecutive), each a thread with its own shm group over one in-memory store.
void on_nodes(const std::vector<int>& node_sizes, const std::function<void(ProcessGroup&)>& body,
              const ProcessGroupOptions& base) {
  static std::shared_ptr<Store> shared = make_memory_store();
  static std::atomic<int> runs{0};
  auto store = make_prefix_store(shared, "nodes" + std::to_string(runs++));
  int world = 0;
  for (int s : node_sizes) world += s;
  std::latch finished(world);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int node = 0, rank = 0; node < static_cast<int>(node_sizes.size()); ++node) {
    for (int local = 0; local < node_sizes[node]; ++local, ++rank) {
      ProcessGroupOptions options = base;
      options.local_rank = local;
      options.local_size = node_sizes[node];
      options.node = node;
      options.nodes = static_cast<int>(node_sizes.size());
      threads.emplace_back([&, rank, options] {
        std::shared_ptr<ProcessGroup> group;
        try {
          group = ProcessGroup::create(rank, world, store, options);
          body(*group);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back("rank " + std::to_string(rank) + " threw: " + e.what());
        }
        finished.arrive_and_wait();
        group.reset();
      });
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// all_reduce of every dtype and op on every path, then the collectives shm
// runs only on one node (Gloo here), with float sums identical on every rank.
// `every_op`: all five ops, else sum and avg (kAvg is the one the hierarchy
// treats apart). Private and allocate()d buffers (mixed ones take the private path).
void check_across_nodes(ProcessGroup& pg, std::vector<unsigned char>& float_bits, bool every_op) {
  const int n = pg.size(), me = pg.rank();
  const std::vector<ReduceOp> ops = every_op
                                        ? std::vector<ReduceOp>(std::begin(kOps), std::end(kOps))
                                        : std::vector<ReduceOp>{ReduceOp::kSum, ReduceOp::kAvg};
  for (DType dtype : kDTypes) {
    const std::size_t e = dtype_size(dtype);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001},
                              kSmallBytes / e + 1, 2 * ((kChunkKiB << 10) / e) + 13}) {
      for (ReduceOp op : ops) {
        for (Memory memory : {Memory::kPrivate, Memory::kShared}) {
          Buffer buf(dtype, count);
          buf.fill(0, count, [&](std::size_t i) { return input_value(me, i, dtype); });
          all_reduce_in(pg, buf, op, memory);
          expect_elements(
              buf, 0, count, [&](std::size_t i) { return all_reduce_reference(op, dtype, n, i); },
              label(me, std::string("all_reduce ") + op_name(op) + " in " + memory_name(memory),
                    count));
        }
      }
    }
  }
  for (Memory memory : kMemories) {
    Buffer buf(DType::kFloat32, 50000);
    buf.fill(0, 50000, [&](std::size_t i) {
      return std::sin(0.37 * static_cast<double>(i) + me) * (1 + 0.3 * me);
    });
    all_reduce_in(pg, buf, ReduceOp::kSum, memory);
    auto* p = static_cast<unsigned char*>(buf.data());
    float_bits.insert(float_bits.end(), p, p + 50000 * 4);
  }
  for (int root = 0; root < n; ++root) {
    Buffer b(DType::kInt64, 1001);
    b.fill(0, 1001, [&](std::size_t i) { return moved_value(me, i, DType::kInt64); });
    pg.broadcast(b.data(), 1001, DType::kInt64, root);
    expect_elements(
        b, 0, 1001, [&](std::size_t i) { return moved_value(root, i, DType::kInt64); },
        label(me, "broadcast from root " + std::to_string(root), 1001));
    Buffer r(DType::kFloat32, 1001);
    r.fill(0, 1001, [&](std::size_t i) { return input_value(me, i, DType::kFloat32); });
    pg.reduce(r.data(), 1001, DType::kFloat32, ReduceOp::kMax, root);
    expect_elements(
        r, 0, 1001,
        [&](std::size_t i) {
          return me == root ? all_reduce_reference(ReduceOp::kMax, DType::kFloat32, n, i)
                            : input_value(me, i, DType::kFloat32);
        },
        label(me, "reduce max to root " + std::to_string(root), 1001));
  }
  Buffer in(DType::kBFloat16, 777), out(DType::kBFloat16, 777 * n);
  in.fill(0, 777, [&](std::size_t i) { return moved_value(me, i, DType::kBFloat16); });
  pg.all_gather(in.data(), out.data(), 777, DType::kBFloat16);
  for (int r = 0; r < n; ++r) {
    expect_elements(
        out, r * 777, 777, [&](std::size_t i) { return moved_value(r, i, DType::kBFloat16); },
        label(me, "all_gather slice " + std::to_string(r), 777));
  }
  pg.barrier();
}

// Ranks per node, and whether every op is checked (else sum and avg: the
// slices and the routing are the same for every op).
struct Layout {
  std::vector<int> sizes;
  bool every_op;
};
// What ctest's "# GetParam() = ..." shows, instead of the struct's bytes.
void PrintTo(const Layout& layout, std::ostream* os) {
  *os << "ranks per node:";
  for (int s : layout.sizes) *os << " " << s;
  if (layout.every_op) *os << ", every collective";
}

class ShmNodes : public Shm, public ::testing::WithParamInterface<Layout> {};

TEST_P(ShmNodes, EveryCollectiveAgreesWithTheReferenceAndFloatSumsMatchBitForBit) {
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", std::to_string(kChunkKiB));
  const Layout layout = GetParam();
  int n = 0;
  for (int s : layout.sizes) n += s;
  std::vector<std::vector<unsigned char>> bits(n);
  on_nodes(
      layout.sizes,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.backend_name(), "shm");
        check_across_nodes(pg, bits[pg.rank()], layout.every_op);
      },
      options());
  for (int r = 1; r < n; ++r)
    EXPECT_TRUE(bits[r] == bits[0]) << "rank " << r << "'s float sums differ from rank 0's";
}

// Same sizes on every node: hierarchical (shm, then Gloo among equal local
// ranks); one rank per node (Gloo among the nodes); nodes of different sizes
// (Gloo over all ranks).
INSTANTIATE_TEST_SUITE_P(Layouts, ShmNodes,
                         ::testing::Values(Layout{{2, 2}, true}, Layout{{3, 3}, false},
                                           Layout{{1, 1, 1}, false}, Layout{{2, 1}, false},
                                           Layout{{1, 3}, false}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           std::string name = "nodes";
                           for (int s : info.param.sizes) name += "_" + std::to_string(s);
                           return name;
                         });

}  // namespace
}  // namespace ddp
