#pragma once
// What this CPU can run, asked once: the kernels pick their loops by it.

namespace ddp::cpu {

#if defined(__x86_64__)
inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// AVX and F16C: eight half <-> float conversions per instruction.
inline bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

}  // namespace ddp::cpu
