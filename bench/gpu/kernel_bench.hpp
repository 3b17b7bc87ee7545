#pragma once
// Per-kernel timings for the shapes of one model (part of gpu_bench): the
// fused GEMV (both kernel generations, with and without the RMSNorm prologue)
// and cuBLAS on each projection at several batch sizes, decode attention
// (both generations; batch 1 at 128 to 32,768 keys, batch 64 at 1,024 keys
// with several split counts; batch 1 also as 32 launches chained in one
// captured graph, at 1 to 128 keys and 1, 2 or the launcher's splits, next to
// a one-thread kernel for the graph's own cost per node; the fused-RoPE
// kernel against RoPE then attention), prefill attention of a 2048-token
// prompt (both generations). Each against its own floor (bytes over the measured copy
// bandwidth, or FLOPs over the measured GEMM rate), so the decode and prefill
// totals can be taken apart. METRONOME_KBENCH_REPS sets the timed launches
// per figure (1 under a profiler).

#include <nlohmann/json.hpp>

#include "model/model_config.hpp"

namespace metronome::bench {

/// Appends rows {"engine": "metronome-kernel", ...} (microseconds) to `rows`.
/// bw: bytes/s (read + write); flops: FLOP/s.
void kernel_bench(const model_config& cfg, const std::string& model, double bw, double flops,
                  nlohmann::json& rows);

} // namespace metronome::bench
