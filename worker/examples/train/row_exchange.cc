#include "row_exchange.h"

#include <algorithm>
#include <string>

#include "ddp/common/error.h"

namespace train {

std::vector<ExchangeUnit> exchange_units(const std::vector<int>& dims, int world, int min_rows) {
  if (dims.size() < 2 || world < 1 || min_rows < 1) {
    throw ddp::Error("exchange_units: " + std::to_string(dims.size()) + " layer sizes, " +
                     std::to_string(world) + " ranks, units of at least " +
                     std::to_string(min_rows) + " rows");
  }
  // The work left, in multiply-adds per sample: a row of layer l costs dims[l].
  long long remaining = 0;
  for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
    if (dims[l] < 1 || dims[l + 1] < 1) {
      throw ddp::Error("exchange_units: layer " + std::to_string(l) + " is " +
                       std::to_string(dims[l]) + " -> " + std::to_string(dims[l + 1]));
    }
    remaining += static_cast<long long>(dims[l]) * dims[l + 1];
  }
  std::vector<ExchangeUnit> units;
  for (int l = static_cast<int>(dims.size()) - 2; l >= 0; --l) {
    const int rows = dims[l + 1];
    const long long row_cost = dims[l];
    for (int begin = 0; begin < rows;) {
      // Guided self-scheduling: a unit is 1/(2 world) of the work left, so the
      // first units are large (one GEMM call's overhead for much work) and the
      // last ones small (the ranks finish together).
      const long long share = 2LL * world * row_cost;
      const long long wanted = std::max<long long>(min_rows, (remaining + share - 1) / share);
      const int size = static_cast<int>(std::min<long long>(wanted, rows - begin));
      units.push_back({l, {begin, begin + size}});
      begin += size;
      remaining -= size * row_cost;
    }
  }
  return units;
}

int publishes_needed(int layers, int layer, bool update) {
  if (layer < 0 || layer >= layers) {
    throw ddp::Error("publishes_needed: layer " + std::to_string(layer) + " of " +
                     std::to_string(layers));
  }
  // Layer l's output gradient is publish number layers - l; its weights are
  // read last by the chain step that writes layer l-1's (publish layers - l + 1).
  // Layer 0's weights are not read by the chain.
  if (update && layer > 0) return layers - layer + 1;
  return layers - layer;
}

std::optional<int> claim_unit(std::int64_t* counter, std::int64_t first, int count) {
  std::atomic_ref<std::int64_t> next(*counter);
  std::int64_t ticket = next.load(std::memory_order_relaxed);
  if (ticket < first) {
    throw ddp::Error("claim_unit: ticket " + std::to_string(ticket) + " before this micro-batch's " +
                     std::to_string(first) + ": a rank skipped a micro-batch");
  }
  // A compare-exchange rather than fetch_add: a rank that finds the units
  // gone must not take a ticket of the next micro-batch.
  while (ticket < first + count) {
    if (next.compare_exchange_weak(ticket, ticket + 1, std::memory_order_relaxed)) {
      return static_cast<int>(ticket - first);
    }
  }
  return std::nullopt;
}

}  // namespace train
