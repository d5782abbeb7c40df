#pragma once
// What collective_worker's modes share: a failed check, which names what was
// checked, and the mode that checks every collective.

#include <string>

namespace collective_worker {

struct CheckFailed {
  std::string what;
};

[[noreturn]] inline void fail(const std::string& what) { throw CheckFailed{what}; }

// Mode "all" ("single": also checks the world is a local world of one): every
// collective, dtype, op, root and count. Prints COLLECTIVES OK rank=R ... and
// returns 0, or prints COLLECTIVES FAILED rank=R: <check> and returns 1.
int run_all(bool single);

}  // namespace collective_worker
