#pragma once
// The tensor-core generation of the 4-bit decode GEMV (gemv_int4_tc.cu),
// which launch_gemv_int4 (gemv_int4.cu) runs where gemv_int4_tensor_cores
// says so. Internal to the two files.

#include <cstdint>

#include "gpu/kernels.hpp"

namespace metronome::gpu {

/// Shared memory one block of either 4-bit GEMV may take.
inline constexpr int32_t int4_smem_limit = 200 * 1024;

/// One launch of the tensor-core GEMV for args.m <= 8 tokens, whose staged
/// inputs fit int4_smem_limit; launch_gemv_int4 checks the arguments and
/// splits the tokens where they do not fit. Host thread of the stream.
void launch_gemv_int4_tc(gemv_epilogue epilogue, const gemv_args& args, const int4_weights& w,
                         cudaStream_t stream);

} // namespace metronome::gpu
