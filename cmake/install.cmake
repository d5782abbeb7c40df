# `cmake --install`: ddprun (bin/) with its gRPC half (libexec/ddprun/), libddp
# (lib/), its public headers (include/ddp/), a CMake package
# (find_package(ddp) -> ddp::ddp) and a pkg-config file (ddp.pc).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ddprun loads libddprun_rpc.so beside itself (the build tree) or from here.
set(DDP_RPC_PLUGIN_INSTALL_DIR "../${CMAKE_INSTALL_LIBEXECDIR}/ddprun")
target_compile_definitions(ddprun_core PRIVATE DDP_RPC_PLUGIN_INSTALL_DIR="${DDP_RPC_PLUGIN_INSTALL_DIR}")

install(TARGETS ddprun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ddprun_rpc LIBRARY DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/ddprun)
install(TARGETS ddp EXPORT ddpTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/worker/include/ddp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The one header of common/ that the public headers use (ddp::Error).
install(FILES ${PROJECT_SOURCE_DIR}/common/include/ddp/common/error.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddp/common)

set(DDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ddpConfig.cmake INSTALL_DESTINATION ${DDP_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
        DESTINATION ${DDP_CMAKE_DIR})

# ddp.pc finds the prefix from its own place, so a prefix given at install time
# (cmake --install --prefix) works: e.g. "../.." from lib/pkgconfig/.
file(RELATIVE_PATH DDP_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ddp.pc.in ${PROJECT_BINARY_DIR}/ddp.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ddp.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
