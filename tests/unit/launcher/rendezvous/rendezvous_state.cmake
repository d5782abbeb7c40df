# RendezvousState unit tests: the rendezvous server's logic on a hand-driven
# clock, through the state and through its parts.
ddp_gtest(rendezvous_state_test LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/rendezvous_state_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/rendezvous_state_rounds_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/rendezvous_state_store_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/rendezvous_lost_node_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/forming_round_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/round_formation_test.cc
          ${CMAKE_CURRENT_LIST_DIR}/node_liveness_test.cc
  LIBS ddprun_rendezvous GTest::gmock)
