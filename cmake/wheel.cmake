# What `pip install` puts where (scikit-build-core runs `cmake --install`
# into the wheel): the extension and libddp in the package (the extension
# finds libddp beside itself), ddprun in the environment's bin/ and its gRPC
# half in <environment>/libexec/ddprun, where ddprun looks for it
# (../libexec/ddprun from its own folder). The Python files come from
# pyproject.toml's wheel.packages.
set(DDP_RPC_PLUGIN_INSTALL_DIR "../libexec/ddprun")
target_compile_definitions(ddprun_core PRIVATE DDP_RPC_PLUGIN_INSTALL_DIR="${DDP_RPC_PLUGIN_INSTALL_DIR}")
install(TARGETS ddprun_torch_ext ddp LIBRARY DESTINATION ddprun)
install(TARGETS ddprun RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR})
install(TARGETS ddprun_rpc LIBRARY DESTINATION ${SKBUILD_DATA_DIR}/libexec/ddprun)
# libddp's NCCL and CUDA runtime: torch has usually loaded them already;
# else from the CUDA toolkit it was built against.
if(DDP_HAVE_NCCL)
  set_target_properties(ddp PROPERTIES INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
endif()
