#pragma once
// The benchmark build's switches: gpu_bench and gpu_tests read them from the
// environment at start (bench/gpu/run_h200.sh sets them for its A/B steps);
// the server reads none of them, so no stray variable in an operator's
// environment can change what `metronome serve` runs.
//
//   METRONOME_KERNELS        kernel generation per family (kernels.hpp,
//                            parse_kernel_generations), e.g. gemv=1,decode=1
//   METRONOME_PDL            auto, 0, 1 or late (kernels.hpp, pdl_mode)
//   METRONOME_STREAM_HINTS   a mask 0..7 of the L2 evict-first hints
//                            (launch.cuh, stream_hint)
//   METRONOME_PROFILE_BATCH  a decode batch size whose captured step the
//                            engine replays once more inside a profiler
//                            range (cuda_runner_options::profile_batch)
//
// A value not understood is named on stderr and left at its default.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/kernels.hpp"
#include "model/environment.hpp"

namespace metronome::bench {

/// Applies METRONOME_KERNELS, METRONOME_STREAM_HINTS and METRONOME_PDL to
/// the process (before any engine starts) and returns METRONOME_PROFILE_BATCH (0 when unset). Main
/// thread, at start.
inline int32_t apply_environment_switches() {
  if (const char* env = std::getenv("METRONOME_KERNELS")) {
    std::vector<std::string> bad;
    gpu::active_kernels() = gpu::parse_kernel_generations(env, &bad);
    for (const std::string& item : bad)
      warn_ignored_setting("METRONOME_KERNELS", item,
                           "expected gemv, decode, prefill, rope or splits = 1 or 2, splits=3, "
                           "or awarps = 2 or 4");
  }
  if (auto hints = env_integer("METRONOME_STREAM_HINTS", 0, 7,
                               "expected a mask from 0 to 7; all hints on", 0))
    gpu::active_kernels().stream_hints = unsigned(*hints);
  const char* pdl = std::getenv("METRONOME_PDL");
  bool bad_pdl = false;
  gpu::set_pdl_mode(gpu::parse_pdl_mode(pdl, &bad_pdl));
  if (bad_pdl)
    warn_ignored_setting("METRONOME_PDL", pdl, "expected auto, 0 (off), 1 (on) or late; auto");
  return int32_t(
    env_integer("METRONOME_PROFILE_BATCH", 1, 1 << 20, "expected a decode batch size; none")
      .value_or(0));
}

} // namespace metronome::bench
