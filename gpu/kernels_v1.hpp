#pragma once
// The first generation of the GEMV and attention kernels (2026-11-30), behind
// the launchers of gpu/kernels.hpp when active_kernels() selects generation 1
// (or when a shape is outside what the second generation covers). Internal to
// gpu/: callers use the launchers of kernels.hpp.

#include "gpu/kernels.hpp"

namespace metronome::gpu {

void launch_gemv_v1(gemv_epilogue epilogue, const gemv_args& args, cudaStream_t stream);

int32_t decode_attention_splits_v1(const attention_shape& shape, int32_t num_seqs,
                                   int32_t num_sms);

void launch_decode_attention_v1(const attention_shape& shape, const bf16* q, const kv_view& kv,
                                const batch_view& batch, int32_t splits, float* part_o,
                                float* part_ml, int32_t* counters, bf16* out,
                                cudaStream_t stream);

void launch_prefill_attention_v1(const attention_shape& shape, const bf16* q, const kv_view& kv,
                                 const batch_view& batch, const prefill_item* items,
                                 int32_t num_items, bf16* out, cudaStream_t stream);

/// Whether the second-generation decode kernel covers this shape (head_dim
/// 16 to 128, at most 8 query heads per kv head).
bool decode_attention_v2_supports(const attention_shape& shape);

} // namespace metronome::gpu
