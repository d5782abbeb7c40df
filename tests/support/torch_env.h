#pragma once
// Test support: the torch 2.x environment that scripts/install-torch-env.sh
// builds from scripts/requirements-torch.txt (torch, Lightning, Accelerate),
// the PyTorch side of our tests. Debian's torch 1.13 (debian_torch.h) stays
// for the one test that keeps old torch covered.

#include <string>

namespace ddp::testing {

// Its interpreter: CMake's DDP_TORCH_PYTHON cache variable
// (default /opt/ddprun-torch/bin/python).
const std::string& torch2_python();

// "" when torch2_python() imports torch 2.x and `module` ("torch", "lightning",
// "accelerate"), else why not, naming the interpreter and the CMake variable
// that points elsewhere (asked once per module). Tests skip with this reason.
std::string torch2_unavailable_reason(const std::string& module = "torch");

}  // namespace ddp::testing
