#include "backends/shm/learned_choices.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace ddp::shm {
namespace {

std::mutex learned_mu;
std::map<ChoiceScope, ChoiceTable>& learned() {
  static auto* tables = new std::map<ChoiceScope, ChoiceTable>;  // lives until exit
  return *tables;
}

bool is_variant_of(Collective c, std::uint8_t byte) {
  const auto v = variants(c);
  return std::any_of(v.begin(), v.end(),
                     [&](Algorithm a) { return static_cast<std::uint8_t>(a) == byte; });
}

}  // namespace

ChoiceTable learned_choices(const ChoiceScope& scope) {
  std::lock_guard<std::mutex> lock(learned_mu);
  const auto it = learned().find(scope);
  return it == learned().end() ? ChoiceTable{} : it->second;
}

void learn_choice(const ChoiceScope& scope, Collective c, int size_class, Algorithm a) {
  std::lock_guard<std::mutex> lock(learned_mu);
  learned()[scope][{c, size_class}] = a;
}

PackedChoices pack(const ChoiceTable& table) {
  PackedChoices packed{};
  for (const auto& [key, algorithm] : table) {
    const int cls = key.second - kFirstClass;
    if (cls < 0 || cls >= kSizeClasses) continue;
    packed[static_cast<int>(key.first)][cls] = static_cast<std::uint8_t>(algorithm);
  }
  return packed;
}

ChoiceTable agreed(const std::vector<PackedChoices>& per_rank) {
  ChoiceTable table;
  for (int c = 0; c < kTunedCollectives; ++c) {
    const auto collective = static_cast<Collective>(c);
    for (int cls = 0; cls < kSizeClasses; ++cls) {
      for (const PackedChoices& rank : per_rank) {
        const std::uint8_t byte = rank[c][cls];
        if (byte == 0 || !is_variant_of(collective, byte)) continue;
        table[{collective, cls + kFirstClass}] = static_cast<Algorithm>(byte);
        break;
      }
    }
  }
  return table;
}

}  // namespace ddp::shm
