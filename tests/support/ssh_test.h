#pragma once
// A test fixture for tests that reach namespace test hosts over real ssh
// (ssh_hosts.h): skipped, saying why, where the hosts cannot be made or sshd
// cannot run. A fixture that starts hosts in its own SetUp calls this one
// first and returns when IsSkipped().

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "netns_test.h"
#include "ssh_hosts.h"

namespace ddp::testing {

class SshTest : public NetnsTest {
 protected:
  void SetUp() override {
    NetnsTest::SetUp();
    if (IsSkipped()) return;
    if (const std::string why = SshHosts::unavailable(); !why.empty()) {
      std::printf("skipped: %s\n", why.c_str());
      GTEST_SKIP() << why;
    }
  }
};

}  // namespace ddp::testing
