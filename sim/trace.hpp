#pragma once
// Request traces for replay: arrival time, prompt tokens and output tokens
// per request, read from the public formats the project ships
// (../shared/testdata/traces) and from a simple CSV.
//
//   azure:    CSV with header TIMESTAMP,ContextTokens,GeneratedTokens;
//             TIMESTAMP "YYYY-MM-DD hh:mm:ss[.fraction]" (Azure LLM
//             inference traces, Splitwise).
//   mooncake: JSON lines {"timestamp": ms, "input_length", "output_length",
//             "hash_ids"} (Mooncake FAST'25 traces; hash_ids name the
//             prompt's blocks of 512 tokens: replay makes equal blocks of
//             equal tokens, so the prefix cache shares them).
//   csv:      CSV with a header naming arrival_s (or arrival_ms),
//             prompt_tokens, output_tokens and optionally class and
//             non_alnum_share, in any column order.

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace metronome::sim {

/// One request of a trace.
struct trace_request {
  /// Seconds since the trace's first request.
  double arrival_s = 0;
  int32_t prompt_tokens = 0;
  /// Output tokens the request really produced (the replay's executor ends
  /// it there; no policy ever sees this number).
  int32_t output_tokens = 0;
  std::string request_class;
  float non_alnum_share = 0;
  /// Mooncake traces: ids of the prompt's blocks of hash_block_tokens
  /// tokens (equal ids: equal tokens, so the prefix cache can share them).
  std::vector<int64_t> hash_ids;
};

/// Tokens per hash_ids block (the Mooncake traces' 512).
constexpr int32_t hash_block_tokens = 512;

/// A trace, sorted by arrival (stable: ties keep file order).
struct trace {
  std::string name;
  std::vector<trace_request> requests;

  /// Seconds from the first arrival to the last.
  double duration_s() const;
};

/// A malformed trace: what() = "<file>:<line>: <field>: <problem>".
class trace_error : public std::runtime_error {
public:
  trace_error(const std::string& file, int64_t line, const std::string& field,
              const std::string& problem);
};

enum class trace_format { azure, mooncake, csv };

/// "azure", "mooncake", "csv"; nullopt-like false for another name.
bool parse_trace_format(std::string_view text, trace_format& out);

/// The format a file most likely has: .jsonl is mooncake; a .csv whose
/// header starts with TIMESTAMP is azure, otherwise csv.
trace_format guess_trace_format(const std::filesystem::path& file);

/// Reads a trace. Throws trace_error naming the file, line and field.
/// Output lengths of 0 count as 1 (the first token is always computed).
trace read_trace(const std::filesystem::path& file, trace_format format);

/// Parses trace text (tests); `source` names it in errors.
trace parse_trace(std::string_view text, trace_format format, const std::string& source);

} // namespace metronome::sim
