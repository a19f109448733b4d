// splitmix64 (Steele, Lea and Flood): the one small seeded generator kvq uses where the stream must
// be the same on every platform (synthetic K/V, rot=hadamard:SEED's signs).
#pragma once

#include <cstdint>

namespace kvq {

/// \brief Advances `state` and returns the next 64-bit output.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace kvq
