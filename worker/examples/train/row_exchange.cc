#include "row_exchange.h"

#include <string>

#include "ddp/common/error.h"

namespace train {

RowRange owned_rows(int rows, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world || rows < 0) {
    throw ddp::Error("owned_rows: rank " + std::to_string(rank) + " of " + std::to_string(world) +
                     " ranks, " + std::to_string(rows) + " rows");
  }
  const auto cut = [&](int r) { return static_cast<int>(static_cast<long>(rows) * r / world); };
  return {cut(rank), cut(rank + 1)};
}

ddp::ElementRange owned_elements(const std::vector<int>& dims, std::size_t param, int world,
                                 int rank) {
  const std::size_t layer = param / 2;
  if (layer + 1 >= dims.size()) {
    throw ddp::Error("owned_elements: parameter " + std::to_string(param) + " of a model with " +
                     std::to_string(dims.size() < 2 ? 0 : 2 * (dims.size() - 1)) + " parameters");
  }
  const RowRange rows = owned_rows(dims[layer + 1], world, rank);
  const std::size_t width = param % 2 == 0 ? static_cast<std::size_t>(dims[layer]) : 1;
  return {static_cast<std::size_t>(rows.begin) * width, static_cast<std::size_t>(rows.end) * width};
}

}  // namespace train
