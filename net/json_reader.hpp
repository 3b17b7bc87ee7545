#pragma once
// Reading JSON request bodies quickly into the nlohmann::json documents the
// request parsers walk.
//
// Design note. nlohmann's parser lexes a character at a time: a completion
// whose prompt is 4,100 token ids (25 KB) took 0.19 ms of the io thread on
// the GPU host, about a tenth of a cached-prefix request's whole host time.
// simdjson validates and indexes the text with SIMD instructions and parses
// numbers in bulk; building the nlohmann document from its tree costs a
// fraction of what nlohmann's own parse does. The document is the one
// nlohmann::json::parse would build: non-negative integers unsigned, negative
// ones signed, other numbers double, a later duplicate key replacing an
// earlier one (the one difference: "-0" is an unsigned zero here, a signed
// one to nlohmann; every reader takes both as the integer 0). Where simdjson refuses a text, nlohmann's parser decides, so
// the language accepted is exactly nlohmann's (integers beyond 64 bits, which
// nlohmann reads as doubles, take that path; so would any text only one of
// the two accepts). tests/net/json_reader_test.cpp and the openai_request
// fuzz target check both parsers agree.

#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace metronome::net {

/// Parses `text` as one JSON value, as nlohmann::json::parse(text) does;
/// std::nullopt when it is not JSON. Does not limit nesting (the caller
/// checks depth first; recursion follows the document). Never throws. Any
/// thread; each thread keeps its own simdjson parser.
std::optional<nlohmann::json> read_json(std::string_view text);

/// Destroys `doc` element by element. nlohmann's destructor moves every
/// element of an array or object onto a heap stack first (which keeps
/// arbitrarily deep documents off the call stack): 90 us for a 4,100-id
/// prompt, twice what reading it takes. Request bodies are at most
/// max_json_depth deep, so plain recursion is safe here; `doc` is left null.
void dispose_json(nlohmann::json& doc) noexcept;

/// Disposes of a document (dispose_json) when it goes out of scope: declare
/// it right after the document.
struct json_disposer {
  nlohmann::json& doc;
  ~json_disposer() {
    dispose_json(doc);
  }
};

} // namespace metronome::net
