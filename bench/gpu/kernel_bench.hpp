#pragma once
// Per-kernel timings for the shapes of one model (part of gpu_bench): the
// fused GEMV and cuBLAS on each projection at several batch sizes, decode
// attention at batch 1 / long context and batch 64, prefill attention of a
// 2048-token prompt. Each against its own floor (bytes over the measured copy
// bandwidth, or FLOPs over the measured GEMM rate), so the decode and prefill
// totals can be taken apart.

#include <nlohmann/json.hpp>

#include "model/model_config.hpp"

namespace metronome::bench {

/// Appends rows {"engine": "metronome-kernel", ...} (microseconds) to `rows`.
/// bw: bytes/s (read + write); flops: FLOP/s.
void kernel_bench(const model_config& cfg, const std::string& model, double bw, double flops,
                  nlohmann::json& rows);

} // namespace metronome::bench
