#include "grad/shared_sum.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "core/process_identity.h"
#include "ddp/common/error.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kLine = 64;
constexpr std::uint64_t kHolderMask = 0xffff;
constexpr std::uint64_t kOne = std::uint64_t{1} << 16;    // one contribution
constexpr auto kYieldFor = std::chrono::milliseconds(2);  // then yield, then sleep in short slices

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

SumLayout make_sum_layout(const std::vector<SumParam>& params, int world,
                          std::size_t min_block_bytes) {
  if (world < 1) throw Error("shared sum: world size " + std::to_string(world) + " is below 1");
  if (min_block_bytes == 0) throw Error("shared sum: the minimum block size must be > 0");
  SumLayout out;
  out.param_offset.resize(params.size(), 0);
  out.row_bytes.resize(params.size(), 0);
  out.blocks_of.resize(params.size());
  std::size_t at = 0;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const SumParam& sp = params[p];
    if (!sp.trainable) continue;
    const std::int64_t rows = std::max<std::int64_t>(sp.rows, 1);
    if (sp.count % static_cast<std::size_t>(rows) != 0) {
      throw Error("shared sum: parameter " + std::to_string(p) + " has " +
                  std::to_string(sp.count) + " elements, not a whole number of its " +
                  std::to_string(rows) + " rows");
    }
    const std::size_t bytes = sp.count * sp.element_bytes;
    out.param_offset[p] = at;
    out.row_bytes[p] = bytes / static_cast<std::size_t>(rows);
    std::int64_t blocks = static_cast<std::int64_t>(bytes / min_block_bytes);
    blocks = std::clamp<std::int64_t>(blocks, 1, std::min<std::int64_t>(2 * world, rows));
    for (std::int64_t k = 0; k < blocks; ++k) {
      const std::int64_t begin = rows * k / blocks, end = rows * (k + 1) / blocks;
      out.blocks_of[p].push_back(out.blocks.size());
      out.blocks.push_back(
          {p, begin, end - begin, at + static_cast<std::size_t>(begin) * out.row_bytes[p]});
    }
    at = round_up(at + bytes, kLine);
  }
  out.buffer_bytes = at;
  return out;
}

std::size_t SharedSum::bytes_needed(const SumLayout& layout, int world) {
  return 2 * layout.buffer_bytes + layout.blocks.size() * kLine +
         static_cast<std::size_t>(world) * kLine +
         round_up(layout.param_offset.size() * 2 * sizeof(std::uint64_t), kLine);
}

SharedSum::SharedSum(SumLayout layout, void* memory, int rank, int world,
                     std::chrono::milliseconds timeout, shm::WaitPolicy policy,
                     std::function<std::string(std::size_t)> name)
    : layout_(std::move(layout)),
      memory_(static_cast<char*>(memory)),
      rank_(rank),
      world_(world),
      timeout_(timeout),
      policy_(policy),
      name_(std::move(name)) {
  if (memory_ == nullptr) throw Error("shared sum: no memory");
  if (world_ < 1 || world_ > static_cast<int>(kHolderMask) - 1 || rank_ < 0 || rank_ >= world_) {
    throw Error("shared sum: rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                " is not supported");
  }
  states_at_ = 2 * layout_.buffer_bytes;
  rounds_at_ = states_at_ + layout_.blocks.size() * kLine;
  missing_at_ = rounds_at_ + static_cast<std::size_t>(world_) * kLine;
  pid_of(rank_).store(static_cast<std::int64_t>(getpid()), std::memory_order_relaxed);
}

std::atomic<std::uint64_t>& SharedSum::state(std::size_t block) const {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(memory_ + states_at_ + block * kLine);
}

std::atomic<std::uint64_t>& SharedSum::rounds_of(int rank) const {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(memory_ + rounds_at_ +
                                                        static_cast<std::size_t>(rank) * kLine);
}

std::atomic<std::int64_t>& SharedSum::pid_of(int rank) const {
  // Beside the rank's round count, on its line (written once, by that rank).
  return *reinterpret_cast<std::atomic<std::int64_t>*>(
      memory_ + rounds_at_ + static_cast<std::size_t>(rank) * kLine + sizeof(std::uint64_t));
}

bool SharedSum::exited(int rank, Clock::time_point since, Clock::time_point& checked) const {
  const auto now = Clock::now();
  // Only once a wait is long, and then every 10 ms: kill() is a system call.
  if (now - since < kYieldFor || now - checked < std::chrono::milliseconds(10)) return false;
  checked = now;
  const std::int64_t pid = pid_of(rank).load(std::memory_order_relaxed);
  if (pid <= 0 || pid == static_cast<std::int64_t>(getpid())) return false;  // ranks as threads
  return process_exited(static_cast<pid_t>(pid));
}

std::atomic<std::uint64_t>& SharedSum::missing_word(std::size_t param, std::uint64_t window) const {
  // Two words per parameter, one per window parity: a rank flags window k + 1
  // while a slower one may still be reading window k's flags.
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(
      memory_ + missing_at_ + (param * 2 + window % 2) * sizeof(std::uint64_t));
}

void SharedSum::pause(Clock::time_point since) const {
  const auto waited = Clock::now() - since;
  if (!policy_.oversubscribed && waited < policy_.spin) {
    shm::cpu_relax();
  } else if (waited < kYieldFor) {
    sched_yield();
  } else {
    // A peer that is this slow is descheduled or busy elsewhere: stop taking
    // a core from whoever else could use it.
    timespec slice{0, 50'000};
    nanosleep(&slice, nullptr);
  }
}

// Waits until one of `param`'s blocks not yet `done` is free; throws
// SharedSumTimeout naming the holder if it exited or held one too long.
double SharedSum::wait_for_a_free_block(std::size_t param, const std::vector<std::size_t>& ids,
                                        const std::vector<char>& done) {
  const std::size_t m = ids.size();
  const auto since = Clock::now();
  auto checked = since;
  for (;;) {
    bool free_block = false;
    std::size_t held = m;
    std::uint64_t holder = 0;
    for (std::size_t k = 0; k < m; ++k) {
      if (done[k]) continue;
      const std::uint64_t v = state(ids[k]).load(std::memory_order_relaxed);
      if ((v & kHolderMask) == 0) {
        free_block = true;
        break;
      }
      held = k;
      holder = v & kHolderMask;
    }
    if (free_block) break;
    const int holder_rank = static_cast<int>(holder) - 1;
    if (exited(holder_rank, since, checked)) {
      const SumBlock& b = layout_.blocks[ids[held]];
      throw SharedSumTimeout(
          "GradSync (shared sum): rank " + std::to_string(holder_rank) + " (pid " +
          std::to_string(pid_of(holder_rank).load()) + ", same node) exited while it held rows [" +
          std::to_string(b.row_begin) + ", " + std::to_string(b.row_begin + b.rows) +
          ") of parameter " + name_(param) + "; rank " + std::to_string(rank_) +
          " was waiting to add its gradient");
    }
    if (Clock::now() - since > timeout_) {
      const SumBlock& b = layout_.blocks[ids[held]];
      throw SharedSumTimeout("GradSync (shared sum): rank " + std::to_string(holder_rank) +
                             " held rows [" + std::to_string(b.row_begin) + ", " +
                             std::to_string(b.row_begin + b.rows) + ") of parameter " +
                             name_(param) + " for longer than the group's timeout of " +
                             std::to_string(timeout_.count()) + " ms while rank " +
                             std::to_string(rank_) + " waited to add its gradient (is rank " +
                             std::to_string(holder_rank) + " stopped or dead?)");
    }
    pause(since);
  }
  return ms(Clock::now() - since);
}

double SharedSum::contribute(std::size_t param, std::uint64_t window, std::uint64_t window_round,
                             const std::function<void(const BlockWrite&)>& write) {
  const std::vector<std::size_t>& ids = layout_.blocks_of.at(param);
  const std::size_t m = ids.size();
  std::vector<char> done(m, 0);
  std::size_t left = m;
  const std::size_t start = static_cast<std::size_t>(rank_) * m / static_cast<std::size_t>(world_);
  const std::uint64_t first_count = window_round * static_cast<std::uint64_t>(world_);
  char* buffer = memory_ + (window % 2) * layout_.buffer_bytes;
  double waited = 0;
  std::exception_ptr failed;
  while (left > 0) {
    bool progressed = false;
    for (std::size_t q = 0; q < m && left > 0; ++q) {
      const std::size_t k = (start + q) % m;
      if (done[k]) continue;
      std::atomic<std::uint64_t>& s = state(ids[k]);
      std::uint64_t v = s.load(std::memory_order_acquire);
      if ((v & kHolderMask) != 0) continue;
      if (!s.compare_exchange_strong(v, v | static_cast<std::uint64_t>(rank_ + 1),
                                     std::memory_order_acquire, std::memory_order_relaxed)) {
        continue;
      }
      const SumBlock& b = layout_.blocks[ids[k]];
      const BlockWrite block{buffer + b.offset, b.row_begin, b.rows, (v >> 16) == first_count};
      if (!failed) {
        try {
          write(block);
        } catch (...) {
          failed = std::current_exception();
        }
      }
      // After a failed write the rest of this parameter counts as zeros, so
      // nobody waits for it, and the window is flagged as invalid.
      if (failed && block.first) {
        std::memset(block.data, 0, static_cast<std::size_t>(b.rows) * layout_.row_bytes[param]);
      }
      s.store(v + kOne, std::memory_order_release);
      done[k] = 1;
      --left;
      progressed = true;
    }
    if (left == 0 || progressed) continue;
    // Every block still to do is held by another rank.
    waited += wait_for_a_free_block(param, ids, done);
  }
  if (failed) {
    flag_missing(param, window);
    std::rethrow_exception(failed);
  }
  return waited;
}

void SharedSum::publish_rounds(std::uint64_t rounds) {
  rounds_of(rank_).store(rounds, std::memory_order_release);
}

double SharedSum::wait_rounds(std::uint64_t rounds) {
  const auto since = Clock::now();
  auto checked = since;
  for (int r = 0; r < world_; ++r) {
    while (rounds_of(r).load(std::memory_order_acquire) < rounds) {
      if (exited(r, since, checked)) {
        throw SharedSumTimeout("GradSync (shared sum): rank " + std::to_string(r) + " (pid " +
                               std::to_string(pid_of(r).load()) +
                               ", same node) exited before it finished adding its gradients of "
                               "iteration " +
                               std::to_string(rounds) + "; rank " + std::to_string(rank_) +
                               " was waiting for it");
      }
      if (Clock::now() - since > timeout_) {
        std::string late;
        for (int q = 0; q < world_; ++q) {
          const std::uint64_t have = rounds_of(q).load(std::memory_order_acquire);
          if (have >= rounds) continue;
          late += (late.empty() ? "rank " : ", rank ") + std::to_string(q) + " (finished " +
                  std::to_string(have) + ")";
        }
        throw SharedSumTimeout("GradSync (shared sum): " + late +
                               " did not finish adding its gradients of iteration " +
                               std::to_string(rounds) + " within the group's timeout of " +
                               std::to_string(timeout_.count()) + " ms; rank " +
                               std::to_string(rank_) + " waited for it");
      }
      pause(since);
    }
  }
  return ms(Clock::now() - since);
}

void* SharedSum::result(std::size_t param, std::uint64_t window) const {
  return memory_ + (window % 2) * layout_.buffer_bytes + layout_.param_offset.at(param);
}

void SharedSum::flag_missing(std::size_t param, std::uint64_t window) {
  missing_word(param, window).store(window + 1, std::memory_order_relaxed);
}

bool SharedSum::missing(std::size_t param, std::uint64_t window) const {
  return missing_word(param, window).load(std::memory_order_relaxed) == window + 1;
}

}  // namespace ddp::detail
