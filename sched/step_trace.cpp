#include "sched/step_trace.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace metronome {

step_trace::step_trace(const std::filesystem::path& path) : out_(path, std::ios::trunc) {
  if (!out_)
    throw std::runtime_error("cannot write the step trace " + path.string() + ": "
                             + std::strerror(errno));
  out_ << "t_s,step,decode_seqs,decode_kv_tokens,prefill_seqs,prefill_tokens,"
          "prefill_attention_pairs,predicted_ms,prior_ms,wall_ms,device_ms\n";
}

step_trace::~step_trace() {
  out_.flush();
}

void step_trace::write(double t_s, const step_record& r) {
  const auto& s = r.shape;
  out_ << fmt::format("{:.6f},{},{},{},{},{},{:.0f},{:.4f},{:.4f},{:.4f},{:.4f}\n", t_s, r.step,
                      s.decode_seqs, s.decode_kv_tokens, s.prefill_seqs, s.prefill_tokens,
                      s.prefill_attention_pairs, r.predicted_ms, r.prior_ms, r.wall_ms,
                      r.device_ms);
  // Often enough that a server stopped hard leaves most of its steps.
  if (++lines_ % 256 == 0)
    out_.flush();
}

} // namespace metronome
