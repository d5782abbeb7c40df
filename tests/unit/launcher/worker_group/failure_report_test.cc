// The report of a failed worker (worker_group/failure_report.h).

#include "worker_group/failure_report.h"

#include <gtest/gtest.h>

#include <string>

namespace ddp::launcher {
namespace {

TEST(FailureReport, NamesRankPidCodeAndLastLines) {
  WorkerOutcome o;
  o.rank = 3;
  o.local_rank = 1;
  o.pid = 4242;
  o.code = 9;
  o.signaled = true;
  EXPECT_EQ(o.launcher_exit_code(), 137);
  auto text = format_failure_report(o, {"boom", "bang"}, 0, 2);
  EXPECT_NE(text.find("rank 3 (local rank 1, pid 4242)"), std::string::npos) << text;
  EXPECT_NE(text.find("SIGKILL (9)"), std::string::npos);
  EXPECT_NE(text.find("out-of-memory"), std::string::npos);
  EXPECT_NE(text.find("| boom\n  | bang"), std::string::npos) << text;
  EXPECT_NE(text.find("attempt 1 of 3"), std::string::npos) << text;
  o.signaled = false;
  o.code = 4;
  EXPECT_EQ(o.launcher_exit_code(), 4);
  EXPECT_NE(format_failure_report(o, {}, 0, 0).find("wrote nothing to stderr"), std::string::npos);
}

}  // namespace
}  // namespace ddp::launcher
