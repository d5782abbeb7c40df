#pragma once
// Reproducible random numbers for the trainer: a SplitMix64 stream (the same
// generator ddp::random_permutation uses) with uniform and normal draws that
// do not depend on the standard library, so the dataset and the initial
// weights are the same for a seed on every rank, compiler and machine with
// the same libm.

#include <cmath>
#include <cstdint>

namespace train {

class Random {
 public:
  // `stream` separates independent uses of one seed (data, teacher, weights).
  Random(std::uint64_t seed, std::uint64_t stream)
      : state_(seed * 0xD1342543DE82EF95ULL + stream * 0x9E3779B97F4A7C15ULL + 1) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1): the top 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + static_cast<float>(uniform()) * (hi - lo); }
  // Standard normal (Box-Muller; one value per call, the pair's sine half is dropped).
  float normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  std::uint64_t state_;
};

}  // namespace train
