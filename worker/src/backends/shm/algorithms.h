#pragma once
// The shm backend's algorithm variants (internal): their names, which
// collective has which, DDP_SHM_ALGO's syntax, the size classes a choice is
// made for, the one choice every rank derives from all ranks' timings, and
// the per-machine tune file (DDP_SHM_TUNE_FILE). Pure: no I/O, no clock; the
// backend times the candidates and reads and writes the file.
//
// The variants, for buffers that every local rank has in the segment
// (allocate()); a variant a call's buffers cannot run (in place with a
// private buffer, small above the single-copy limit) runs through the chunk
// slots instead, the path of private buffers:
//   push     each rank writes its share of the result into every rank's buffer
//   pull     each rank writes only its own buffer, reading the others'
//   chunked  through the segment's double-buffered chunk slots (copies in and out)
//   small    all_reduce up to the single-copy limit: one copy into a slot, every
//            rank reduces all slots itself

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::shm {

// Every collective the shm backend runs. The first kTunedCollectives have
// variants (chosen by timing or DDP_SHM_ALGO); reduce (chunked) and barrier
// (one phase) have one way each.
enum class Collective : std::uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kBarrier
};
inline constexpr int kTunedCollectives = 4;
enum class Algorithm : std::uint8_t { kAuto = 0, kPush, kPull, kChunked, kSmall };
inline constexpr std::size_t kMaxVariants = 4;

const char* collective_name(Collective c);
const char* algorithm_name(Algorithm a);
// "all_reduce" -> kAllReduce; nullopt for any other text (and for the
// collectives without variants).
std::optional<Collective> collective_named(std::string_view name);
// The variants `c` has, in the order a tie between timings is broken (first wins).
std::span<const Algorithm> variants(Collective c);
// The variants timed for a call of `bytes` per rank: small only up to `small_bytes`.
std::vector<Algorithm> candidates(Collective c, std::size_t bytes, std::size_t small_bytes);

// What DDP_SHM_ALGO forces, per collective (kAuto: chosen by timing).
//   ""  or "auto"                   every collective timed
//   NAME                            every collective that has the variant NAME
//   COLL=NAME[,COLL=NAME...]        the collectives named; NAME may be auto
struct Forced {
  std::array<Algorithm, kTunedCollectives> by{};
  Algorithm of(Collective c) const { return by[static_cast<int>(c)]; }
  // One byte per collective, for comparing ranks' settings in a descriptor.
  std::uint32_t packed() const;
  static Forced unpacked(std::uint32_t packed);
  // "auto", or e.g. "all_reduce=pull,broadcast=chunked".
  std::string describe() const;
};
// Throws ddp::Error naming `source` (e.g. "environment variable DDP_SHM_ALGO")
// and what is wrong: an unknown name, or a variant the collective lacks.
Forced parse_forced(std::string_view text, std::string_view source);

// Size classes: calls of up to 1 KiB, then each power of two up to 16 MiB,
// then everything larger (timed at kLargestTimedBytes per rank).
inline constexpr int kFirstClass = 10, kLastClass = 25;
inline constexpr std::size_t kLargestTimedBytes = std::size_t{16} << 20;
int size_class(std::size_t bytes);
// The largest call of a class, in bytes; SIZE_MAX for the last.
std::size_t class_limit(int size_class);

// seconds[rank][candidate]: each rank's time for each candidate. Returns the
// candidate whose slowest rank was fastest, ties to the lower index; every
// rank given the same table returns the same index. Fills `slowest`, when
// given, with each candidate's slowest-rank time. Throws ddp::Error for an
// empty or ragged table.
std::size_t choose(const std::vector<std::vector<double>>& seconds,
                   std::vector<double>* slowest = nullptr);

// The choices of one node's ranks: (collective, size class) -> variant.
using ChoiceTable = std::map<std::pair<Collective, int>, Algorithm>;

// The choice `table` holds for collective `c` in the size class nearest to
// `size_class` (the smaller one on a tie) among those that can run calls of
// `size_class` (small only up to `small_bytes`); nullopt when there is none.
std::optional<Algorithm> nearest_choice(const ChoiceTable& table, Collective c, int size_class,
                                        std::size_t small_bytes);

// How long the ranks of a group may spend timing variants, in total, before
// later size classes take the nearest timed class's choice instead.
inline constexpr double kDefaultTimingBudgetMs = 50;
// DDP_SHM_TUNE_BUDGET_MS's value (milliseconds, >= 0; "" = the default).
// Throws ddp::Error naming the variable for anything else.
double parse_timing_budget(std::string_view text);

// One line of a tune file: "COLLECTIVE RANKS MAX_BYTES ALGORITHM", MAX_BYTES
// a class limit (1024, 2048, ... 16777216) or "larger".
struct TuneEntry {
  Collective collective;
  int ranks;
  int size_class;
  Algorithm algorithm;
  bool operator==(const TuneEntry&) const = default;
};
// Blank lines and '#' comments are skipped. Throws ddp::Error naming
// `path`, the line number and what is wrong with it.
std::vector<TuneEntry> parse_tune_file(std::string_view text, const std::string& path);
// `entries` with `table` (for `ranks` local ranks) merged in, one line each, in a stable order.
std::vector<TuneEntry> merged(const std::vector<TuneEntry>& entries, int ranks,
                              const ChoiceTable& table);
std::string format_tune_file(const std::vector<TuneEntry>& entries, std::string_view comment);
// The entries for `ranks` local ranks.
ChoiceTable table_for(const std::vector<TuneEntry>& entries, int ranks);

}  // namespace ddp::shm
