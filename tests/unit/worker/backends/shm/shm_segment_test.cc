// The shm segment's setup between processes (worker/src/backends/shm/segment.h): a
// rank that attached notices at once, not at the deadline, when another
// rank of the node dies before every rank has attached, and removes the
// segment's name so nothing is left in /dev/shm.

#include "backends/shm/segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/common/error.h"
#include "ddp/common/random_id.h"
#include "scoped_env.h"

namespace ddp::shm {
namespace {

using Clock = std::chrono::steady_clock;
using ::ddp::testing::ScopedEnv;
using namespace std::chrono_literals;

Geometry small_geometry(int local_size) {
  Geometry g;
  g.local_size = local_size;
  g.arena_bytes = 1 << 20;
  return g;
}

bool name_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Runs `body` in a child process and waits for it to exit.
template <class Body>
void in_child_process(Body body) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// The creator made the segment (an attacher can map it) and died before it
// marked itself attached: it was still pre-faulting the segment's pages.
TEST(ShmSegmentSetup, ACreatorThatDiesBeforeMarkingItselfAttachedIsNamedAtOnce) {
  const std::string name = "/ddp-test-segment-" + random_hex(12);
  // The child exits without marking itself attached; exiting unmaps, but
  // leaves the name (only wait_attached_and_unlink() removes it).
  in_child_process([&] { Segment::create(name, small_geometry(2), 0); });

  std::unique_ptr<Segment> segment = Segment::try_attach(name, 1, 2);
  ASSERT_NE(segment, nullptr) << "the segment was finished before its creator died";
  segment->mark_attached();
  const auto start = Clock::now();
  try {
    segment->wait_attached_and_unlink(start + 20s);
    FAIL() << "the wait ended as if every rank had attached";
  } catch (const Error& e) {
    EXPECT_LT(Clock::now() - start, 5s) << "named at the deadline, not at once: " << e.what();
    EXPECT_NE(std::string(e.what()).find("local rank 0 (pid "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(name_exists(name)) << "the segment's name was left in /dev/shm";
}

// The rank that never came at all is named when the deadline passes.
TEST(ShmSegmentSetup, ARankThatNeverAttachesIsNamedAtTheDeadline) {
  const std::string name = "/ddp-test-segment-" + random_hex(12);
  std::unique_ptr<Segment> creator = Segment::create(name, small_geometry(2), 0);
  creator->mark_attached();
  const auto start = Clock::now();
  try {
    creator->wait_attached_and_unlink(start + 300ms);
    FAIL() << "the wait ended as if every rank had attached";
  } catch (const Error& e) {
    EXPECT_GE(Clock::now() - start, 300ms);
    EXPECT_NE(std::string(e.what()).find("local rank(s) 1 did not attach"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(name_exists(name));
}

// The chunk slots' size: a group's option (ProcessGroupOptions::shm_chunk_bytes)
// over DDP_SHM_CHUNK_KB over the default, rounded up to a page; an option under
// the smallest chunk is refused naming it.
TEST(ShmGeometry, AGroupsChunkOptionWinsOverTheVariableAndIsRoundedToAPage) {
  {
    ScopedEnv unset("DDP_SHM_CHUNK_KB", std::nullopt);
    EXPECT_EQ(Geometry::from_env(2).chunk_bytes, std::size_t{256} << 10);
  }
  ScopedEnv chunk("DDP_SHM_CHUNK_KB", "128");
  EXPECT_EQ(Geometry::from_env(2).chunk_bytes, std::size_t{128} << 10);
  EXPECT_EQ(Geometry::from_env(2, 0).chunk_bytes, std::size_t{128} << 10);
  EXPECT_EQ(Geometry::from_env(2, std::size_t{1} << 20).chunk_bytes, std::size_t{1} << 20);
  EXPECT_EQ(Geometry::from_env(2, (std::size_t{64} << 10) + 1).chunk_bytes,
            (std::size_t{64} << 10) + 4096);
  try {
    Geometry::from_env(2, 1000);
    ADD_FAILURE() << "a 1000-byte chunk was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shm_chunk_bytes=1000"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::shm
