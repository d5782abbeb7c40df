# RendezvousState unit tests: the rendezvous server's logic on a hand-driven clock.
include(GoogleTest)
find_package(GTest REQUIRED)

add_executable(rendezvous_state_test ${CMAKE_CURRENT_LIST_DIR}/rendezvous_state_test.cc)
target_link_libraries(rendezvous_state_test PRIVATE ddprun_rendezvous GTest::gmock GTest::gtest_main)
ddp_strict(rendezvous_state_test)
gtest_discover_tests(rendezvous_state_test PROPERTIES LABELS unit)
