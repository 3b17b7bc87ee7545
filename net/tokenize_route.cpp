#include "net/tokenize_route.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "actors/request_actor.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace metronome::net {

namespace {

/// What the post-processor puts before and after a text's ids (a BOS
/// token, say), found by encoding one character with and without it.
std::pair<std::vector<int32_t>, std::vector<int32_t>> special_wrapping(const tokenizer& tok) {
  const auto bare = tok.encode("a", {false, false});
  const auto wrapped = tok.encode("a", {true, false});
  auto at = std::search(wrapped.begin(), wrapped.end(), bare.begin(), bare.end());
  if (bare.empty() || at == wrapped.end())
    return {};
  return {std::vector<int32_t>(wrapped.begin(), at),
          std::vector<int32_t>(at + std::ptrdiff_t(bare.size()), wrapped.end())};
}

} // namespace

std::expected<nlohmann::json, api_error> tokenize_answer(const tokenize_request& req,
                                                         const tokenizer& tok,
                                                         const chat_template* tmpl,
                                                         int32_t max_model_len) {
  std::vector<int32_t> ids;
  try {
    if (!req.chat) {
      ids = tok.encode(req.prompt, {req.add_special_tokens, false});
    } else {
      if (!tmpl)
        return std::unexpected(api_error::bad_request("the model has no chat template",
                                                      "messages", "invalid_value"));
      ids = encode_chat(tok, *tmpl, req.messages, req.add_generation_prompt);
      if (req.add_special_tokens) {
        auto [before, after] = special_wrapping(tok);
        ids.insert(ids.begin(), before.begin(), before.end());
        ids.insert(ids.end(), after.begin(), after.end());
      }
    }
  } catch (const std::exception& e) {
    return std::unexpected(api_error::bad_request(e.what(), req.chat ? "messages" : "prompt",
                                                  "invalid_value"));
  }
  nlohmann::json body;
  body["count"] = ids.size();
  body["max_model_len"] = max_model_len;
  body["tokens"] = std::move(ids);
  return body;
}

std::expected<nlohmann::json, api_error> detokenize_answer(const detokenize_request& req,
                                                           const tokenizer& tok) {
  const int32_t vocab = tok.vocab_size();
  for (size_t i = 0; i < req.tokens.size(); ++i)
    if (req.tokens[i] < 0 || req.tokens[i] >= vocab)
      return std::unexpected(api_error::bad_request(
        fmt::format("'tokens[{}]' is {}, outside the vocabulary (0..{})", i, req.tokens[i],
                    vocab - 1),
        "tokens", "invalid_value"));
  try {
    return nlohmann::json{{"prompt", tok.decode(req.tokens, {false, false})}};
  } catch (const std::exception& e) {
    return std::unexpected(api_error::bad_request(e.what(), "tokens", "invalid_value"));
  }
}

} // namespace metronome::net
