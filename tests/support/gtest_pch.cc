// The anchor of the test executables' precompiled <gtest/gtest.h>
// (tests/CMakeLists.txt, ddp_gtest): built only for that header, never run.
int main() { return 0; }
