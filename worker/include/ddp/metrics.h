#pragma once
// Helpers from the field for metrics: sums and means across ranks, weighted
// averages of metric dictionaries, and this process's memory use.
//
// Each collective helper comes in two forms: over the default group (the one
// ddp::init() made) and over a given ProcessGroup. In a world of one without
// ddp::init() the default-group forms do nothing and return their input (like
// the usual Python helpers when torch.distributed is not initialized); in a
// distributed process without ddp::init() they throw ddp::Error. They are
// collectives: every rank of the group must call them, in the same order.
// Buffers are host memory.

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "ddp/process_group.h"
#include "ddp/types.h"

namespace ddp {

// C++ types with a DType: float, double, 32/64-bit signed integers, uint8_t.
template <typename T>
concept HasDType = std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::uint8_t> ||
    (std::is_integral_v<T>&& std::is_signed_v<T> && !std::is_same_v<T, bool> &&
     (sizeof(T) == 4 || sizeof(T) == 8));

template <HasDType T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  if constexpr (std::is_same_v<T, std::uint8_t>) return DType::kUInt8;
  if constexpr (std::is_integral_v<T> && sizeof(T) == 4) return DType::kInt32;
  return DType::kInt64;
}

// In place: data[i] = sum over ranks of data[i].
void reduce_sum(void* data, std::size_t count, DType dtype);
void reduce_sum(void* data, std::size_t count, DType dtype, ProcessGroup& group);
// In place: data[i] = (sum over ranks of data[i]) / group size. Integer
// dtypes divide with truncation; use a floating type for exact means.
void reduce_mean(void* data, std::size_t count, DType dtype);
void reduce_mean(void* data, std::size_t count, DType dtype, ProcessGroup& group);

template <HasDType T>
void reduce_sum(std::span<T> data) {
  reduce_sum(data.data(), data.size(), dtype_of<T>());
}
template <HasDType T>
void reduce_sum(std::span<T> data, ProcessGroup& group) {
  reduce_sum(data.data(), data.size(), dtype_of<T>(), group);
}
template <HasDType T>
void reduce_mean(std::span<T> data) {
  reduce_mean(data.data(), data.size(), dtype_of<T>());
}
template <HasDType T>
void reduce_mean(std::span<T> data, ProcessGroup& group) {
  reduce_mean(data.data(), data.size(), dtype_of<T>(), group);
}

// The sum of a scalar over ranks, in its own type (integers stay exact).
template <HasDType T>
T reduce_sum(T value) {
  reduce_sum(&value, 1, dtype_of<T>());
  return value;
}
template <HasDType T>
T reduce_sum(T value, ProcessGroup& group) {
  reduce_sum(&value, 1, dtype_of<T>(), group);
  return value;
}
// The mean of a scalar over ranks, in double (integers included: the mean of
// 1 and 2 is 1.5).
double reduce_mean(double value);
double reduce_mean(double value, ProcessGroup& group);

using Metrics = std::map<std::string, double>;

// Every metric averaged over ranks, weighted by each rank's `count` (e.g. the
// number of samples behind its values):
//   result[k] = sum over ranks of (metrics[k] * count) / sum over ranks of count.
// One all_reduce (float64) carries every key and the counts. The keys must be
// the same on every rank; they are compared first (one small all_gather), and
// a difference throws ddp::Error on every rank naming the rank(s) whose keys
// differ from the key set most ranks have (ties: the lowest rank's) and the
// keys involved. Throws too when the counts sum
// to 0. In a world of one the metrics come back unchanged.
Metrics average_metrics(const Metrics& metrics, double count = 1.0);
Metrics average_metrics(const Metrics& metrics, double count, ProcessGroup& group);

// A training step of this rank ended: counted, and timed from the previous
// one, on ddprun's progress board (`ddprun status` STEPS and step time, the
// ddprun_rank_steps_total metric), for programs whose steps libddp does not
// see itself (a synchronising GradSync or SharedGradSum finish counts one
// already). Without ddprun's board it does nothing. Not a collective;
// thread-safe; a few nanoseconds.
void step_finished();

// This process's memory, in bytes.
struct MemoryStats {
  std::uint64_t uss = 0;       // unique set size: Private_Clean + Private_Dirty
  std::uint64_t rss = 0;       // resident set size (VmRSS)
  std::uint64_t peak_rss = 0;  // high-water mark of the resident set (VmHWM)
};
// The unique set size (USS) of this process, in bytes: the memory that
// would be freed if it exited (psutil's memory_full_info().uss). From
// /proc/self/smaps_rollup, or /proc/self/smaps on kernels without it.
// Throws ddp::Error when neither can be read. Not a collective.
std::uint64_t memory_usage();
// USS, RSS and peak RSS together.
MemoryStats memory_stats();
// Pure: the USS in bytes that an smaps or smaps_rollup text describes (the
// sum of its Private_Clean and Private_Dirty lines).
std::uint64_t parse_smaps_uss(std::string_view smaps_text);

}  // namespace ddp
