#pragma once
// Which dims of a key's K and V rows each lane of the decode attention's
// tensor-core kernel holds (gpu/decode_attention.cu). Host code includes it
// too: tests/gpu/attention_test.cpp checks the layout's invariants on
// machines without a GPU.

#if defined(__CUDACC__)
#define METRONOME_HD __host__ __device__ __forceinline__
#else
#define METRONOME_HD inline
#endif

namespace metronome::gpu::decode_layout {

/// Which dims of a key a lane holds. A lane holds D/4 dims of K (and of q)
/// and D/8 of V. Where that is more than one 16-byte load, the lanes that
/// share a row interleave their loads (lane t's i-th load at 16 t + 64 i
/// bytes of a K row, lane g's at 16 g + 128 i of a V row), so that every
/// load instruction reads whole 32-byte sectors. Contiguous runs per lane
/// used half of each sector per load, so every sector crossed from L2 twice
/// (Nsight Compute, 8B batch 64 on the H200: L2 78% busy, 49% excess
/// sectors); interleaved, the 8B shape's attention took 5-19% less time.
/// A dot product and a weighted sum do not care which dims a lane holds, as
/// long as K and q agree; the output dims follow v_dim().
template <int D, bool WIDE = false>
struct tc_cfg {
  static constexpr int kw = D / 8;  // words of K per key a lane holds (D/4 dims)
  static constexpr int vw = D / 16; // words of V per key a lane holds (D/8 dims)
  static constexpr int ks = D / 16; // k steps of S^T = K Q^T, and m16 tiles of O^T
  /// A lane holds runs of k_run contiguous elements of a K row, k_stride
  /// apart (the 4 lanes of a row side by side), and of v_run of a V row,
  /// v_stride apart (8 lanes). One 16-byte load a run of bf16; WIDE (the fp8
  /// cache's layout): 16 bytes a run of fp8, so that a load instruction
  /// reads 64 or 128 bytes of a row rather than 32 or 64.
  static constexpr int k_run = WIDE ? (D / 4 < 16 ? D / 4 : 16) : (D / 4 < 8 ? D / 4 : 8);
  static constexpr int v_run = WIDE ? (D / 8 < 16 ? D / 8 : 16) : (D / 8 < 8 ? D / 8 : 8);
  static constexpr int k_stride = 4 * k_run, v_stride = 8 * v_run;
  static constexpr int kcw = k_run / 2, vcw = v_run / 2; // words a run
  /// First K (and q) element of lane t in a row.
  static METRONOME_HD int k_base(int t) { return t * k_run; }
  /// The K (and q) element in the low half of word w of lane t.
  static METRONOME_HD int k_elem(int t, int w) {
    return k_base(t) + (w / kcw) * k_stride + 2 * (w % kcw);
  }
  /// First V element of lane g in a row.
  static METRONOME_HD int v_base(int g) { return g * v_run; }
  /// The dim in the low half of V word w of lane g (the high half is the next).
  static METRONOME_HD int v_dim(int g, int w) {
    return v_base(g) + (w / vcw) * v_stride + 2 * (w % vcw);
  }
};

} // namespace metronome::gpu::decode_layout
