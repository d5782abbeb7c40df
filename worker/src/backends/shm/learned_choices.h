#pragma once
// The algorithm choices a process's shm groups timed, kept for its later
// groups of the same run and shape (internal to the shm backend).
//
// Why: live recovery makes a new group for every epoch. Timing the variants
// again inside the new group's first step costs that step about 100 ms on a
// busy machine (a 16 MiB candidate per variant, each run twice), a step the
// whole group waits for. Each rank publishes what its process learned in its
// RankControl before it marks itself attached; once every rank has attached
// they all take, class by class, the choice of the lowest local rank that
// has one, so a relaunched process, which learned nothing, agrees with the
// survivors. The tune file (DDP_SHM_TUNE_FILE) still overrides.

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/shm/algorithms.h"

namespace ddp::shm {

inline constexpr int kSizeClasses = kLastClass - kFirstClass + 1;
// One byte per (collective, size class): an Algorithm; 0 (kAuto) for none.
using PackedChoices = std::array<std::array<std::uint8_t, kSizeClasses>, kTunedCollectives>;

// What a learned choice holds for: the groups of one run and round with the
// same number of local ranks and the same slot sizes.
struct ChoiceScope {
  std::string run_id;
  long round = 0;
  int local_size = 0;
  std::size_t small_bytes = 0;
  std::size_t chunk_bytes = 0;
  auto operator<=>(const ChoiceScope&) const = default;
};

// This process's learned choices for `scope` (empty when none). Thread-safe.
ChoiceTable learned_choices(const ChoiceScope& scope);
// Records a timed choice for `scope`'s later groups. Thread-safe.
void learn_choice(const ChoiceScope& scope, Collective c, int size_class, Algorithm a);

PackedChoices pack(const ChoiceTable& table);
// Class by class, the choice of the first of `per_rank` (local rank order)
// that has one; bytes that name no variant of their collective are skipped.
// Every rank given the same tables returns the same table.
ChoiceTable agreed(const std::vector<PackedChoices>& per_rank);

}  // namespace ddp::shm
