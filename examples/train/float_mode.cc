#include "float_mode.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

namespace train {

#if defined(__x86_64__) || defined(__i386__)

bool flush_denormals() {
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
  return true;
}

bool denormals_flushed() {
  return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON &&
         _MM_GET_DENORMALS_ZERO_MODE() == _MM_DENORMALS_ZERO_ON;
}

#elif defined(__aarch64__)

namespace {
constexpr std::uint64_t kFz = std::uint64_t{1} << 24;  // FPCR.FZ
std::uint64_t fpcr() {
  std::uint64_t value;
  asm volatile("mrs %0, fpcr" : "=r"(value));
  return value;
}
}  // namespace

bool flush_denormals() {
  const std::uint64_t value = fpcr() | kFz;
  asm volatile("msr fpcr, %0" : : "r"(value));
  return true;
}

bool denormals_flushed() { return (fpcr() & kFz) != 0; }

#else

bool flush_denormals() { return false; }
bool denormals_flushed() { return false; }

#endif

}  // namespace train
