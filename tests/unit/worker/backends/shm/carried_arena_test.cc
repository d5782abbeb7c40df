// The shm arena a process carries from one group to the next
// (ProcessGroupOptions::shm_carry_arena, backends/shm/carried_arena.h): a
// later group's blocks get the pages an earlier group's blocks had, the
// collectives run in place over arenas mapped from other files, and a
// relaunched process takes over the arena its predecessor left, and a rank
// alone on its node takes its blocks from the arena too; and
// Healer::state_memory() outside heal mode.

#include "backends/shm/carried_arena.h"
#include "heal/state_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "ddp/common/shm_names.h"
#include "ddp/heal.h"
#include "ddp/process_group.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

bool shm_exists(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

// A file of `bytes` named `name` whose first page is filled with `fill`.
void make_file(const std::string& name, std::size_t bytes, unsigned char fill) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  ASSERT_EQ(pwrite(fd, std::string(4096, static_cast<char>(fill)).data(), 4096, 0), 4096);
  close(fd);
}

unsigned char first_byte(int fd) {
  unsigned char c = 0;
  EXPECT_EQ(pread(fd, &c, 1, 0), 1);
  return c;
}

TEST(CarriedArena, ARelaunchTakesOverItsPredecessorsArenaWithItsPages) {
  const std::string heir = "/ddp-carried-test-heir-" + random_hex(8);
  const std::string name = "/ddp-carried-test-" + random_hex(8);
  make_file(heir, 8 << 20, 0x5a);
  {
    auto arena = shm::CarriedArena::make(name, 8 << 20, heir);
    EXPECT_TRUE(arena->inherited());
    EXPECT_EQ(first_byte(arena->fd()), 0x5a) << "the predecessor's pages come along";
    EXPECT_EQ(arena->resident_bytes(), 4096u);
    EXPECT_FALSE(shm_exists(heir));
    EXPECT_TRUE(shm_exists(name));
  }
  EXPECT_FALSE(shm_exists(name)) << "an arena's name goes with it";
}

TEST(CarriedArena, AnHeirOfAnotherSizeIsRemovedAndAFreshArenaMade) {
  const std::string heir = "/ddp-carried-test-heir-" + random_hex(8);
  const std::string name = "/ddp-carried-test-" + random_hex(8);
  make_file(heir, 4 << 20, 0x5a);
  auto arena = shm::CarriedArena::make(name, 8 << 20, heir);
  EXPECT_FALSE(arena->inherited());
  EXPECT_EQ(first_byte(arena->fd()), 0);
  struct stat st {};
  ASSERT_EQ(fstat(arena->fd(), &st), 0);
  EXPECT_EQ(st.st_size, 8 << 20);
  EXPECT_FALSE(shm_exists(heir));
  // Without an heir, or when it is not there: a fresh one.
  const std::string other = "/ddp-carried-test-" + random_hex(8);
  EXPECT_FALSE(shm::CarriedArena::make(other, 8 << 20, "")->inherited());
  EXPECT_FALSE(shm::CarriedArena::make(other, 8 << 20, heir)->inherited());
}

TEST(StateMemory, OutsideHealModeItIsPrivateZeroedMemoryAndZeroBytesIsRefused) {
  ASSERT_FALSE(Healer::requested()) << "this test runs outside ddprun";
  const std::size_t bytes = (3 << 20) + 100;
  std::shared_ptr<void> a = Healer::state_memory(bytes), b = Healer::state_memory(bytes);
  auto* pa = static_cast<unsigned char*>(a.get());
  auto* pb = static_cast<unsigned char*>(b.get());
  ASSERT_NE(pa, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pa) % 4096, 0u) << "page-aligned";
  for (std::size_t i = 0; i < bytes; i += 4099) EXPECT_EQ(pa[i], 0) << "byte " << i;
  EXPECT_EQ(pa[bytes - 1], 0);
  std::memset(pa, 0x5a, bytes);
  EXPECT_TRUE(pb + bytes <= pa || pa + bytes <= pb) << "two blocks never overlap";
  EXPECT_EQ(pb[0], 0);
  // No file of this process: outside heal mode the memory is private.
  const std::string mine = "state-p" + std::to_string(getpid());
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    const std::size_t at = name.find(mine);
    EXPECT_TRUE(at == std::string::npos || std::isdigit(name[at + mine.size()])) << e.path();
  }
  EXPECT_THROW(Healer::state_memory(0), Error);
}

// A relaunch's inherited state memory (Healer::state_memory()): zeroed, or
// left as the predecessor wrote it for a program whose state transfer
// overwrites it all.
TEST(StateMemory, AnInheritedBlockIsZeroedOrKeepsThePredecessorsBytesAsAsked) {
  const std::size_t bytes = (3 << 20) + 4096;
  for (const auto fill : {Healer::StateFill::kZeros, Healer::StateFill::kUnspecified}) {
    const std::string name = "/ddp-carried-test-state-" + random_hex(8);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    shm_unlink(name.c_str());
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    const std::string predecessors(bytes, '\x5a');
    ASSERT_EQ(pwrite(fd, predecessors.data(), bytes, 0), static_cast<ssize_t>(bytes));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    close(fd);
    auto* c = static_cast<unsigned char*>(p);
    detail::ready_inherited(static_cast<char*>(p), bytes, fill);
    const unsigned char want = fill == Healer::StateFill::kZeros ? 0 : 0x5a;
    for (std::size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(c[i], want) << "byte " << i;
    EXPECT_EQ(c[bytes - 1], want);
    c[bytes - 1] = 7;  // writable either way
    EXPECT_EQ(c[bytes - 1], 7);
    munmap(p, bytes);
  }
}

MemberSet pair_at(std::uint64_t epoch) {
  MemberSet set;
  set.epoch = epoch;
  set.members = {{0, 0}, {1, 0}};
  return set;
}

// Each rank (a thread) takes a block of `count` floats, reads its first
// value, fills it with rank + 1 and all-reduces it in place (the shm
// backend's zero-copy path: every block is in the segment). Returns the
// first values read, by rank; checks the sums.
std::vector<float> take_fill_and_sum(const MemberSet& set, const std::shared_ptr<Store>& store,
                                     const ProcessGroupOptions& options, std::size_t count) {
  std::vector<std::future<float>> ranks;
  for (const Member& m : set.members) {
    ranks.push_back(std::async(std::launch::async, [&, id = m.id] {
      auto group = ProcessGroup::create(set, id, store, options);
      auto block = group->allocate(count * sizeof(float));
      auto* data = static_cast<float*>(block.get());
      const float was = data[0];
      std::fill(data, data + count, static_cast<float>(group->rank() + 1));
      group->all_reduce(data, count, DType::kFloat32);
      for (std::size_t i = 0; i < count; i += 4096) {
        if (data[i] != 3.0f) ADD_FAILURE() << "element " << i << " holds " << data[i];
      }
      group->barrier();  // nobody's block goes while a peer may still read it
      return was;
    }));
  }
  std::vector<float> seen;
  for (auto& r : ranks) seen.push_back(r.get());
  return seen;
}

TEST(CarriedArena, ALaterGroupsBlocksHaveTheEarlierGroupsPages) {
  const std::size_t count = 1 << 20;  // 4 MiB per rank
  ProcessGroupOptions options = ProcessGroupOptions::of("shm");
  options.timeout = 20s;
  options.run_id = "carried" + std::to_string(getpid());
  // In place, and no variant timed on scratch pages taken (and returned
  // empty) between the two ranks' blocks.
  options.shm_algorithm = "push";
  const auto store = make_memory_store();

  // Without the option every group's arena is in its own new segment: zeros.
  take_fill_and_sum(pair_at(0), store, options, count);
  for (float was : take_fill_and_sum(pair_at(1), store, options, count)) EXPECT_EQ(was, 0.0f);

  // With it, the second group's blocks hold what the first group's left.
  options.shm_carry_arena = true;
  for (float was : take_fill_and_sum(pair_at(2), store, options, count)) EXPECT_EQ(was, 0.0f);
  for (float was : take_fill_and_sum(pair_at(3), store, options, count)) EXPECT_EQ(was, 3.0f);

  // The arena is named for this process (ddprun removes it when it dies).
  bool named = false;
  const std::string prefix = shm_arena_prefix(options.run_id, getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    named = named || entry.path().filename().string().rfind(prefix, 0) == 0;
  EXPECT_TRUE(named) << "no /dev/shm entry starts with " << prefix;
}

// The /dev/shm file mapped at `p` in this process ("" when none): its name
// in /proc/self/maps.
std::string shm_file_at(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2 || at < lo || at >= hi) continue;
    const auto path = line.find("/dev/shm/");
    return path == std::string::npos ? "" : line.substr(path + 9);
  }
  return "";
}

// A group that shrank to one rank on its node has no segment, but its
// blocks still come from the process's carried arena (the pages its last
// group's blocks had), not from fresh private memory.
TEST(CarriedArena, ARankAloneOnItsNodeTakesItsBlocksFromTheArena) {
  ProcessGroupOptions options = ProcessGroupOptions::of("shm");
  options.timeout = 20s;
  options.run_id = "lone" + std::to_string(getpid());
  const auto store = make_memory_store();
  MemberSet alone;
  alone.members = {{0, 0}};
  const std::size_t bytes = 4 << 20;
  const std::string arena_of_this_process = shm_arena_prefix(options.run_id, getpid());

  auto group = ProcessGroup::create(alone, 0, store, options);
  auto block = group->allocate(bytes);
  EXPECT_EQ(shm_file_at(block.get()), "") << "without the option: private memory";

  options.shm_carry_arena = true;
  alone.epoch = 1;
  group = ProcessGroup::create(alone, 0, store, options);
  block = group->allocate(bytes);
  EXPECT_EQ(group->backend_name(), "shm");
  EXPECT_NE(shm_file_at(block.get()).find(arena_of_this_process), std::string::npos)
      << "mapped from '" << shm_file_at(block.get()) << "'";
  std::memset(block.get(), 7, bytes);
  block.reset();
  group.reset();

  // The next lone group's block has those pages, and two blocks never overlap.
  alone.epoch = 2;
  group = ProcessGroup::create(alone, 0, store, options);
  block = group->allocate(bytes);
  auto second = group->allocate(bytes);
  EXPECT_EQ(static_cast<unsigned char*>(block.get())[bytes - 1], 7);
  auto* a = static_cast<char*>(block.get());
  auto* b = static_cast<char*>(second.get());
  EXPECT_TRUE(a + bytes <= b || b + bytes <= a);
  EXPECT_NE(shm_file_at(second.get()).find(arena_of_this_process), std::string::npos);
}

// The same for a rank alone on its node in a group of several nodes: its
// blocks come from the carried arena, and the collectives across the nodes
// run on them.
TEST(CarriedArena, ARankAloneOnItsNodeOfSeveralTakesItsBlocksFromTheArena) {
  ProcessGroupOptions options = ProcessGroupOptions::of("shm");
  options.timeout = 20s;
  options.run_id = "lone-nodes" + std::to_string(getpid());
  options.shm_carry_arena = true;
  const auto store = make_memory_store();
  MemberSet two_nodes;
  two_nodes.members = {{0, 0}, {1, 1}};
  const std::string arena_of_this_process = shm_arena_prefix(options.run_id, getpid());
  std::vector<std::future<std::string>> ranks;
  for (int id : {0, 1}) {
    ranks.push_back(std::async(std::launch::async, [&, id] {
      auto group = ProcessGroup::create(two_nodes, id, store, options);
      const std::size_t count = 1 << 18;
      auto block = group->allocate(count * sizeof(float));
      auto* data = static_cast<float*>(block.get());
      std::fill(data, data + count, static_cast<float>(group->rank() + 1));
      group->all_reduce(data, count, DType::kFloat32);
      EXPECT_EQ(data[count - 1], 3.0f);
      group->barrier();
      return shm_file_at(block.get());
    }));
  }
  for (auto& r : ranks) {
    const std::string file = r.get();
    EXPECT_NE(file.find(arena_of_this_process), std::string::npos)
        << "mapped from '" << file << "'";
  }
}

}  // namespace
}  // namespace ddp
