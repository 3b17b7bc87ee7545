#pragma once
// What both generations of the prefill attention (prefill_attention.cu,
// prefill_attention_v1.cu) share: where a block works and where its
// threads sit in the MMA fragments (prefill_block_of), which of a score
// tile's keys a row sees (score_visible), and the host-side checks and
// head_dim dispatch of their launchers. The device helpers are
// __forceinline__: the kernels' generated code is what it was inline.

#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"

namespace metronome::gpu::prefill_detail {

/// A prefill attention block's work and a thread's place: query head
/// blockIdx.x and its kv head, work item blockIdx.y, and the thread's lane
/// and warp, with g (lane / 4: the accumulator row within eight) and t4
/// (lane % 4: the column pair) of the m16n8 fragments.
struct prefill_block {
  int head, kvh;
  prefill_item item;
  int tid, lane, warp, g, t4;
};

/// The block's prefill_block, read after the kernel's pdl_wait() (the items
/// are step inputs). An item with seq < 0 is padding (a captured mixed
/// step): the kernel returns at once when it sees one, the whole block
/// before any barrier (the kv head's two integer divisions, computed here
/// first, are all a padding block does besides).
__device__ __forceinline__ prefill_block prefill_block_of(const attention_shape& sh,
                                                          const prefill_item* __restrict__ items) {
  const int head = blockIdx.x;
  const prefill_item item = items[blockIdx.y];
  const int kvh = head / (sh.num_heads / sh.kv_heads);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  return {head, kvh, item, tid, lane, warp, g, t4};
}

/// Whether the row at position pos sees the key of a thread's score s[j][c]
/// in an m16n8 accumulator tile of keys from kt (key kt + 8 j + 2 t4 +
/// (c & 1)): causally, and within the sliding window where window > 0.
/// pos and window come by reference: so passed, nvcc keeps the kernels'
/// two mask loops (with and without a window) as they were inline; by
/// value it merged them into one that tests the window at every score.
__device__ __forceinline__ bool score_visible(int32_t kt, int j, int c, int t4,
                                              const int32_t& pos, const int32_t& window) {
  const int32_t key = kt + j * 8 + 2 * t4 + (c & 1);
  return key <= pos && (window <= 0 || key > pos - window);
}

// -- host side, both generations -----------------------------------------------------

/// The checks both launch_prefill_attention generations make before they
/// dispatch: work items within the grid's y limit, consistent head counts
/// and head_dim.
inline void check_prefill_args(const attention_shape& sh, const kv_view& kv, int32_t num_items) {
  if (num_items > 65535)
    throw cuda_error("launch_prefill_attention: " + std::to_string(num_items)
                     + " tiles exceed the grid limit");
  if (sh.num_heads % sh.kv_heads != 0 || sh.head_dim != kv.head_dim)
    throw cuda_error("launch_prefill_attention: inconsistent head counts or head_dim");
}

/// Calls f.template operator()<D>() (f: a lambda []<int D>() {...}) with
/// D = head_dim, one of 16, 32, 64, 128, 256; throws for any other.
template <class F>
void dispatch_prefill_head_dim(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 16: return f.template operator()<16>();
    case 32: return f.template operator()<32>();
    case 64: return f.template operator()<64>();
    case 128: return f.template operator()<128>();
    case 256: return f.template operator()<256>();
    default:
      throw cuda_error("launch_prefill_attention: head_dim " + std::to_string(head_dim)
                       + " is not supported (16, 32, 64, 128, 256)");
  }
}

} // namespace metronome::gpu::prefill_detail
