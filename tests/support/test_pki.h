#pragma once
// Test certificates made with the openssl command at run time: a CA, a
// server certificate for localhost/127.0.0.1 signed by it, and an unrelated
// CA. Made once per test process.

#include <string>

namespace ddp::testing {

struct TestPki {
  std::string dir, ca, cert, key, other_ca;
  std::string error;  // non-empty when openssl is missing or failed (tests skip with it)
};

const TestPki& test_pki();

}  // namespace ddp::testing
