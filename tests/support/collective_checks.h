#pragma once
// Test support: per-rank checks of collectives against the reference values
// of typed_buffer.h, shared by the thread-rank tests of every backend. Each
// runs on one rank (inside on_ranks) and reports through gtest.

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "ddp/process_group.h"
#include "typed_buffer.h"

namespace ddp::testing {

// One failure per buffer, naming the first element that differs.
template <class Expected>
void expect_elements(const Buffer& got, std::size_t first, std::size_t n, Expected&& expected,
                     const std::string& what) {
  std::string message = got.mismatch(first, n, expected, what);
  if (!message.empty()) ADD_FAILURE() << message;
}

inline std::string label(int rank, const std::string& what, std::size_t count) {
  return "rank " + std::to_string(rank) + ": " + what + " of " + std::to_string(count);
}

// The element counts to try for a dtype.
using CountsFor = std::function<std::vector<std::size_t>(DType)>;

// Every dtype, root and count: every rank ends with root's values.
inline void check_broadcast_from_every_root(ProcessGroup& pg, const CountsFor& counts) {
  for (DType dtype : kDTypes) {
    for (int root = 0; root < pg.size(); ++root) {
      for (std::size_t count : counts(dtype)) {
        Buffer buf(dtype, count);
        buf.fill(0, count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
        pg.broadcast(buf.data(), count, dtype, root);
        expect_elements(
            buf, 0, count, [&](std::size_t i) { return moved_value(root, i, dtype); },
            label(pg.rank(), "broadcast from root " + std::to_string(root), count));
      }
    }
  }
}

// One reduce: root gets the reduction, every other rank keeps its input.
inline void check_reduce(ProcessGroup& pg, DType dtype, ReduceOp op, int root, std::size_t count) {
  Buffer buf(dtype, count);
  buf.fill(0, count, [&](std::size_t i) { return input_value(pg.rank(), i, dtype); });
  pg.reduce(buf.data(), count, dtype, op, root);
  auto what = label(
      pg.rank(), std::string("reduce ") + op_name(op) + " to root " + std::to_string(root), count);
  if (pg.rank() == root) {
    expect_elements(
        buf, 0, count,
        [&](std::size_t i) {
          return reference(op, dtype, pg.size(), [&](int r) { return input_value(r, i, dtype); });
        },
        what);
  } else {
    expect_elements(
        buf, 0, count, [&](std::size_t i) { return input_value(pg.rank(), i, dtype); },
        what + " (non-root must be unchanged)");
  }
}

// Every dtype and count: slice r of the output is rank r's input, the input untouched.
inline void check_all_gather(ProcessGroup& pg, const CountsFor& counts) {
  const int n = pg.size();
  for (DType dtype : kDTypes) {
    for (std::size_t count : counts(dtype)) {
      Buffer in(dtype, count), out(dtype, count * n);
      in.fill(0, count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); });
      pg.all_gather(in.data(), out.data(), count, dtype);
      for (int r = 0; r < n; ++r) {
        expect_elements(
            out, r * count, count, [&](std::size_t i) { return moved_value(r, i, dtype); },
            label(pg.rank(), "all_gather slice " + std::to_string(r), count));
      }
      expect_elements(
          in, 0, count, [&](std::size_t i) { return moved_value(pg.rank(), i, dtype); },
          label(pg.rank(), "all_gather input untouched", count));
    }
  }
}

}  // namespace ddp::testing
