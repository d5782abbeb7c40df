#pragma once
// How this process's CPU arithmetic treats denormal (subnormal) floats.
// Once a model's small values (vanishing gradients, dead activations) reach
// the denormal range, x86 arithmetic on them takes a slow microcode path,
// tens of times slower per operation; flushed to zero they cost nothing.
// TensorFlow trains so on CPUs by default; PyTorch's switch is
// torch.set_flush_denormal(True).

namespace train {

// Flushes denormal results and inputs to zero in the calling thread and in
// the threads it starts afterwards (x86-64: MXCSR's FTZ and DAZ bits;
// AArch64: FPCR.FZ). Returns false, changing nothing, where the CPU has no
// such mode. Call before starting threads.
bool flush_denormals();

// Whether the calling thread flushes denormals to zero.
bool denormals_flushed();

}  // namespace train
