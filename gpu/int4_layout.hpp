#pragma once
// The layout the CUDA runner keeps 4-bit projections in, and the host
// repacking of a GPTQ v1 or AWQ GEMM projection into it. Host arithmetic
// only (metronome_gpu_host): tested on any machine (tests/engine_parts).
//
// Design note. The checkpoints pack eight 4-bit values into a 32-bit word
// along the input (GPTQ) or, interleaved, along the output (AWQ), with the
// scales and zeros in their own [groups][out] tensors. The decode GEMV
// streams one output row at a time along its inputs, 16 bytes a lane, so
// here each output row is a run of words along the inputs (nibble e of word
// j is stored column 8j + e), and the scale and zero of each (row, group)
// share one word next to nothing else: a lane reads its 32 values and one
// scale-zero word, and the 32 values always lie in one group (group sizes
// are multiples of 32). Act-order checkpoints (GPTQ desc_act) give each
// input row any group; sorting the inputs by group makes the groups runs
// again, and the kernel reads its input vector through that permutation
// while staging it. Fused projections (q, k and v; gate and up) stack their
// rows, which needs one input order for all of them: where act-order
// permutations differ, the stack is refused and the runner keeps that
// projection as dequantized bf16.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/quantization_config.hpp"
#include "model/quantized_linear.hpp"

namespace metronome::gpu {

/// One 4-bit matrix of `rows` outputs and `cols` inputs as the kernels read
/// it: w[r][perm[j]] = scale(r, g) * (q(r, j) - zero(r, g)), g = j /
/// group_size, for stored column j.
struct int4_layout {
  int64_t rows = 0;
  int64_t cols = 0;
  /// Stored columns per group (cols for one group per row).
  int32_t group_size = 0;
  /// [rows][cols / 8]: nibble e (bits 4e..4e+3) of word j is the unsigned
  /// q of stored column 8j + e.
  std::vector<uint32_t> q;
  /// [rows][groups()]: bits 0-15 the fp16 scale, bits 16-23 the zero
  /// (0..16: GPTQ v1 stores zero - 1, so 16 occurs).
  std::vector<uint32_t> scale_zero;
  /// Empty (stored column j is input j), or [cols]: stored column j is
  /// input perm[j].
  std::vector<int32_t> perm;

  int64_t groups() const {
    return (cols + group_size - 1) / group_size;
  }

  /// Device bytes of q, scale_zero and perm.
  size_t bytes() const {
    return (q.size() + scale_zero.size() + perm.size()) * 4;
  }
};

/// Whether the kernels take a projection of `cols` inputs in groups of
/// `group_size` (-1: one group): cols a multiple of 32 and groups of whole
/// 32-column runs. Any thread.
bool int4_kernels_take(int64_t cols, int32_t group_size);

/// Repacks `p`, stored in `cfg`'s layout, exactly (the same integers, scales
/// and zeros as quantized_linear's dequantize). Throws model_error naming
/// g_idx when act-order groups do not sort into runs of group_size rows.
/// Parallel over rows (parallel_for); any thread.
int4_layout repack_int4(const quantization_config& cfg, const quantized_linear& p);

/// Stacks `parts` along rows (fused qkv, gate_up). nullopt when their input
/// orders or group sizes differ, with the reason in `why`.
std::optional<int4_layout> stack_int4(std::vector<int4_layout> parts, std::string* why = nullptr);

/// w [rows][cols] fp32 in the inputs' own order: exact (an fp16 scale times
/// an integer of at most 5 bits). Any thread.
void dequantize(const int4_layout& m, float* w);

/// The fp32 value of fp16 bits `h` (exact). Any thread.
float half_bits_to_float(uint16_t h);

} // namespace metronome::gpu
