// collective_worker's "all" and "single" modes: every collective for every
// dtype, op, root and count, checked against values computed from the
// ranks' known inputs.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective_worker.h"
#include "ddp/ddp.h"
#include "typed_buffer.h"

namespace collective_worker {
namespace {

using namespace std::chrono_literals;
using ddp::DType;
using ddp::ReduceOp;

using ddp::testing::input_value;
using ddp::testing::is_float;
using ddp::testing::kCounts;
using ddp::testing::kDTypes;
using ddp::testing::kOps;
using ddp::testing::moved_value;
using ddp::testing::reference;

// The shared typed buffer, failing the run (CheckFailed) on a mismatch.
class Buffer : public ddp::testing::Buffer {
 public:
  using ddp::testing::Buffer::Buffer;
  template <class F>
  void fill(std::size_t n, F&& f) {
    ddp::testing::Buffer::fill(0, n, std::forward<F>(f));
  }
  // Elements [first, first + n) must equal expected(j), j counting from 0.
  template <class Expected>
  void expect(std::size_t first, std::size_t n, Expected&& expected,
              const std::string& what) const {
    std::string message = mismatch(first, n, std::forward<Expected>(expected), what);
    if (!message.empty()) fail(message);
  }
};

std::string of(std::size_t count) { return " of " + std::to_string(count); }

void check_all_reduce(ddp::ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : kCounts) {
        Buffer buf(dtype, count);
        buf.fill(count, [&](std::size_t i) { return input_value(me, i, dtype); });
        pg.all_reduce(buf.data(), count, dtype, op);
        buf.expect(
            0, count,
            [&](std::size_t i) {
              return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
            },
            std::string("all_reduce ") + ddp::op_name(op) + of(count));
      }
    }
  }
}

void check_broadcast(ddp::ProcessGroup& pg) {
  for (DType dtype : kDTypes) {
    for (int root = 0; root < pg.size(); ++root) {
      for (std::size_t count : kCounts) {
        Buffer buf(dtype, count);
        buf.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
        pg.broadcast(buf.data(), count, dtype, root);
        buf.expect(
            0, count, [&](std::size_t i) { return moved_value(root, i, dtype); },
            "broadcast from root " + std::to_string(root) + of(count));
      }
    }
  }
}

void check_reduce(ddp::ProcessGroup& pg) {
  const int n = pg.size(), me = pg.rank();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (int root = 0; root < n; ++root) {
        const std::size_t count = 7;
        Buffer buf(dtype, count);
        buf.fill(count, [&](std::size_t i) { return input_value(me, i, dtype); });
        pg.reduce(buf.data(), count, dtype, op, root);
        auto what = std::string("reduce ") + ddp::op_name(op) + " to root " + std::to_string(root) +
                    of(count);
        if (me == root) {
          buf.expect(
              0, count,
              [&](std::size_t i) {
                return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
              },
              what);
        } else {
          buf.expect(
              0, count, [&](std::size_t i) { return input_value(me, i, dtype); },
              what + " (non-root data must be unchanged)");
        }
      }
    }
  }
}

void check_all_gather(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (std::size_t count : kCounts) {
      Buffer in(dtype, count), out(dtype, count * n);
      in.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
      pg.all_gather(in.data(), out.data(), count, dtype);
      for (int r = 0; r < n; ++r) {
        out.expect(
            r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
            "all_gather slice " + std::to_string(r) + of(count));
      }
    }
  }
}

void check_gather(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count), out(dtype, count * n);
        in.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
        pg.gather(in.data(), pg.rank() == root ? out.data() : nullptr, count, dtype, root);
        if (pg.rank() != root) continue;
        for (int r = 0; r < n; ++r) {
          out.expect(
              r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
              "gather to root " + std::to_string(root) + ", slice " + std::to_string(r) +
                  of(count));
        }
      }
    }
  }
}

void check_scatter(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (int root = 0; root < n; ++root) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count * n), out(dtype, count);
        in.fill(count * n, [&](std::size_t k) { return moved_value(root, k, dtype); });
        pg.scatter(pg.rank() == root ? in.data() : nullptr, out.data(), count, dtype, root);
        const std::size_t first = pg.rank() * count;
        out.expect(
            0, count, [&](std::size_t i) { return moved_value(root, first + i, dtype); },
            "scatter from root " + std::to_string(root) + of(count));
      }
    }
  }
}

void check_all_to_all(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (std::size_t count : kCounts) {
      Buffer in(dtype, count * n), out(dtype, count * n);
      in.fill(count * n, [&](std::size_t k) { return moved_value(pg.rank(), k, dtype); });
      pg.all_to_all(in.data(), out.data(), count, dtype);
      for (int i = 0; i < n; ++i) {
        out.expect(
            i * count, count,
            [&](std::size_t j) { return moved_value(i, pg.rank() * count + j, dtype); },
            "all_to_all slice from rank " + std::to_string(i) + of(count));
      }
    }
  }
}

void check_reduce_scatter(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t count : kCounts) {
        Buffer in(dtype, count * n), out(dtype, count);
        in.fill(count * n, [&](std::size_t k) { return input_value(pg.rank(), k, dtype); });
        pg.reduce_scatter(in.data(), out.data(), count, dtype, op);
        const std::size_t first = pg.rank() * count;
        out.expect(
            0, count,
            [&](std::size_t i) {
              return reference(op, dtype, n,
                               [&](int r) { return input_value(r, first + i, dtype); });
            },
            std::string("reduce_scatter ") + ddp::op_name(op) + of(count));
      }
    }
  }
}

void check_objects(ddp::ProcessGroup& pg) {
  const int n = pg.size();
  for (int root = 0; root < n; ++root) {
    for (std::size_t length :
         {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{5000}}) {
      std::string expected(length, '\0');
      for (std::size_t i = 0; i < length; ++i)
        expected[i] = static_cast<char>((i * 31 + root) % 256);
      std::string bytes = pg.rank() == root ? expected : std::string(pg.rank() + 5, 'x');
      pg.broadcast_object(bytes, root);
      if (bytes != expected) {
        fail("broadcast_object of " + std::to_string(length) + " bytes from root " +
             std::to_string(root) + ": got " + std::to_string(bytes.size()) + " bytes that differ");
      }
    }
  }
  auto object_of = [](int r) {
    std::string s(static_cast<std::size_t>(r) * 3, '\0');  // rank 0: empty
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(r * 40 + i);
    return s;
  };
  auto all = pg.all_gather_object(object_of(pg.rank()));
  if (static_cast<int>(all.size()) != n)
    fail("all_gather_object returned " + std::to_string(all.size()) + " objects");
  for (int r = 0; r < n; ++r) {
    if (all[r] != object_of(r))
      fail("all_gather_object: object of rank " + std::to_string(r) + " differs");
  }
  if (pg.all_gather_object("") != std::vector<std::string>(n))
    fail("all_gather_object of empty objects");
}

void check_barrier_and_async(ddp::ProcessGroup& pg) {
  pg.barrier();
  const int n = pg.size();
  const std::size_t count = 7;
  Buffer a(DType::kFloat32, count), b(DType::kInt64, count), gathered(DType::kInt32, count * n),
      mine(DType::kInt32, count);
  a.fill(count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kFloat32); });
  b.fill(count, [&](std::size_t i) { return input_value(pg.rank(), i, DType::kInt64); });
  mine.fill(count, [&](std::size_t i) { return moved_value(pg.rank(), i, DType::kInt32); });
  std::vector<std::shared_ptr<ddp::Work>> works;
  works.push_back(pg.all_reduce_async(a.data(), count, DType::kFloat32, ReduceOp::kSum));
  works.push_back(pg.all_reduce_async(b.data(), count, DType::kInt64, ReduceOp::kMin));
  works.push_back(pg.all_gather_async(mine.data(), gathered.data(), count, DType::kInt32));
  works.push_back(pg.barrier_async());
  for (auto it = works.rbegin(); it != works.rend(); ++it) {
    if (!(*it)->wait(60s)) fail("async " + (*it)->description() + " did not finish within 60 s");
  }
  for (auto& w : works) {
    if (!w->is_completed())
      fail("async " + w->description() + ": is_completed() is false after wait()");
  }
  auto ref = [&](ReduceOp op, DType dtype, std::size_t i) {
    return reference(op, dtype, n, [&](int r) { return input_value(r, i, dtype); });
  };
  a.expect(
      0, count, [&](std::size_t i) { return ref(ReduceOp::kSum, DType::kFloat32, i); },
      "async all_reduce sum");
  b.expect(
      0, count, [&](std::size_t i) { return ref(ReduceOp::kMin, DType::kInt64, i); },
      "async all_reduce min");
  for (int r = 0; r < n; ++r) {
    gathered.expect(
        r * count, count, [&](std::size_t i) { return moved_value(r, i, DType::kInt32); },
        "async all_gather slice " + std::to_string(r));
  }
}

}  // namespace

int run_all(bool single) {
  auto group = ddp::init();
  ddp::ProcessGroup& pg = *group;
  const int rank = pg.rank();
  try {
    if (pg.rank() != ddp::rank() || pg.size() != ddp::world_size()) {
      fail("group is rank " + std::to_string(pg.rank()) + " of " + std::to_string(pg.size()) +
           ", the environment says " + std::to_string(ddp::rank()) + " of " +
           std::to_string(ddp::world_size()));
    }
    if (ddp::init() != group || &ddp::default_group() != group.get() || !ddp::is_initialized()) {
      fail("a second ddp::init() or default_group() did not return the group made by the first");
    }
    if (single && (pg.size() != 1 || ddp::is_distributed() || pg.backend_name() != "local")) {
      fail("single: expected a local world of one, got " + std::to_string(pg.size()) +
           " rank(s) on '" + pg.backend_name() + "'");
    }
    check_all_reduce(pg);
    check_broadcast(pg);
    check_reduce(pg);
    check_all_gather(pg);
    check_gather(pg);
    check_scatter(pg);
    check_all_to_all(pg);
    check_reduce_scatter(pg);
    check_objects(pg);
    check_barrier_and_async(pg);
  } catch (const CheckFailed& f) {
    // stderr: ddprun's failure report quotes the failed rank's last stderr lines.
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: %s\n", rank, f.what.c_str());
    return 1;
  }
  const std::string backend = pg.backend_name();
  const int world = pg.size();
  group.reset();
  ddp::shutdown();
  if (ddp::is_initialized()) {
    std::fprintf(stderr, "COLLECTIVES FAILED rank=%d: is_initialized() after shutdown()\n", rank);
    return 1;
  }
  std::printf("COLLECTIVES OK rank=%d world=%d backend=%s\n", rank, world, backend.c_str());
  return 0;
}

}  // namespace collective_worker
