#pragma once
// A test fixture for tests on namespace test hosts: skipped, saying why, where
// they cannot be made (not root, no `ip`). A fixture that makes hosts in its
// own SetUp calls this one first and returns when IsSkipped().

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "netns_hosts.h"

namespace ddp::testing {

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = NetnsHosts::unavailable();
    if (!why.empty()) {
      std::printf("skipped: %s\n", why.c_str());
      GTEST_SKIP() << why;
    }
  }
};

}  // namespace ddp::testing
