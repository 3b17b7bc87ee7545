#pragma once
// Counter-based random numbers: value i of stream s is a pure function of
// (s, i), so results never depend on thread count, chunking or machine.
// Shared with CUDA sources (host and device): C++20, no library calls.

#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define METRONOME_HD __host__ __device__
#else
#define METRONOME_HD
#endif

namespace metronome {

/// The SplitMix64 finaliser: a bijective 64-bit mix with full avalanche.
METRONOME_HD constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Value `index` of stream `stream` as 64 random bits.
METRONOME_HD constexpr uint64_t random_bits(uint64_t stream, uint64_t index) {
  return mix64(mix64(stream) ^ (index * 0xd1b54a32d192ed03ull));
}

/// Value `index` of stream `stream`, uniform in [0, 1) with 24 bits: exact
/// in float, so every machine computes the same float.
METRONOME_HD constexpr float random_unit(uint64_t stream, uint64_t index) {
  return float(random_bits(stream, index) >> 40) * (1.0f / 16777216.0f);
}

/// FNV-1a hash of a name, to derive a stream per tensor.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= uint8_t(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

} // namespace metronome
