#include "net/openai_request.hpp"

#include "net/json_reader.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

namespace metronome::net {

using json = nlohmann::json;

namespace {

// -- JSON nesting -----------------------------------------------------------------

/// Deepest array/object nesting of `text`, counted outside strings; stops
/// counting once `limit` is exceeded. Malformed text is the parser's problem.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit)
            return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0)
          --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

// -- field readers ----------------------------------------------------------------

// Each reader looks up `key` in `obj`; absent or null leaves `out` alone and
// succeeds. A wrong type or range returns the 400 to answer with.
using check = std::optional<api_error>;

const json* find(const json& obj, std::string_view key) {
  auto i = obj.find(key);
  if (i == obj.end() || i->is_null())
    return nullptr;
  return &*i;
}

api_error type_error(std::string_view param, std::string_view expected) {
  return api_error::bad_request(fmt::format("'{}' must be {}", param, expected),
                                std::string(param), "invalid_type");
}

/// An integral JSON number (also 3.0) that fits int64; nullopt otherwise.
std::optional<int64_t> as_integer(const json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned())
    return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.0e15)
      return int64_t(d);
  }
  return std::nullopt;
}

/// A float parameter in [lo, hi] (or (lo, hi] when `lo_open`).
check read_float(const json& obj, std::string_view key, float& out, double lo, double hi,
                 bool lo_open = false) {
  auto v = find(obj, key);
  if (!v)
    return {};
  if (!v->is_number())
    return type_error(key, "a number");
  double d = v->get<double>();
  bool ok = (lo_open ? d > lo : d >= lo) && d <= hi;
  if (!ok)
    return api_error::bad_request(fmt::format("'{}' must lie in {}{}, {}], got {}", key,
                                              lo_open ? "(" : "[", lo, hi, v->dump()),
                                  std::string(key));
  out = float(d);
  return {};
}

/// An integer parameter in [lo, hi].
check read_int(const json& obj, std::string_view key, std::optional<int64_t>& out, int64_t lo,
               int64_t hi) {
  auto v = find(obj, key);
  if (!v)
    return {};
  if (!v->is_number())
    return type_error(key, "an integer");
  auto i = as_integer(*v);
  if (!i)
    return type_error(key, "an integer");
  if (*i < lo || *i > hi)
    return api_error::bad_request(fmt::format("'{}' must lie in [{}, {}], got {}", key, lo, hi,
                                              *i),
                                  std::string(key));
  out = *i;
  return {};
}

check read_bool(const json& obj, std::string_view key, bool& out) {
  auto v = find(obj, key);
  if (!v)
    return {};
  if (!v->is_boolean())
    return type_error(key, "a boolean");
  out = v->get<bool>();
  return {};
}

check unsupported(std::string_view param, std::string_view what) {
  return api_error::bad_request(fmt::format("{} is not supported by this server", what),
                                std::string(param), "unsupported_value");
}

#define METRONOME_TRY(expr)                                                                    \
  if (auto err_ = (expr))                                                                      \
    return std::unexpected(std::move(*err_));

// -- messages and prompt --------------------------------------------------------------

/// Text of a message's `content`: a string, or an array of text parts joined
/// by newlines. `null` is allowed for assistant turns (tool calls).
check read_content(const json& msg, size_t index, const std::string& role, std::string& out) {
  auto param = fmt::format("messages[{}].content", index);
  auto i = msg.find("content");
  if (i == msg.end() || i->is_null()) {
    if (role == "assistant")
      return {};
    return api_error::bad_request(fmt::format("'{}' is required", param), param,
                                  "missing_required_parameter");
  }
  if (i->is_string()) {
    out = i->get<std::string>();
    return {};
  }
  if (!i->is_array())
    return type_error(param, "a string or an array of content parts");
  bool first = true;
  for (size_t j = 0; j < i->size(); ++j) {
    const auto& part = (*i)[j];
    auto part_param = fmt::format("{}[{}]", param, j);
    if (!part.is_object())
      return type_error(part_param, "an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return type_error(part_param + ".type", "a string");
    if (*type != "text")
      return unsupported(part_param + ".type",
                         fmt::format("content part type '{}'", type->get<std::string>()));
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return type_error(part_param + ".text", "a string");
    if (!first)
      out += '\n';
    out += text->get<std::string>();
    first = false;
  }
  return {};
}

check read_messages(const json& body, generate_request& req) {
  auto v = find(body, "messages");
  if (!v)
    return api_error::bad_request("'messages' is required", "messages",
                                  "missing_required_parameter");
  if (!v->is_array())
    return type_error("messages", "an array");
  if (v->empty())
    return api_error::bad_request("'messages' must contain at least one message", "messages");
  req.messages.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const auto& msg = (*v)[i];
    auto param = fmt::format("messages[{}]", i);
    if (!msg.is_object())
      return type_error(param, "an object");
    auto role = msg.find("role");
    if (role == msg.end() || role->is_null())
      return api_error::bad_request(fmt::format("'{}.role' is required", param),
                                    param + ".role", "missing_required_parameter");
    if (!role->is_string())
      return type_error(param + ".role", "a string");
    auto r = role->get<std::string>();
    if (r == "developer")
      r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      return api_error::bad_request(
        fmt::format("'{}.role' must be one of system, developer, user, assistant; got '{}'",
                    param, role->get<std::string>()),
        param + ".role");
    chat_turn turn;
    turn.role = r;
    if (auto err = read_content(msg, i, r, turn.content))
      return err;
    req.messages.push_back(std::move(turn));
  }
  return {};
}

/// Token ids from an array of integers in [0, 2^31).
check read_token_ids(const json& arr, std::string_view param, std::vector<int32_t>& out) {
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    auto id = arr[i].is_number() ? as_integer(arr[i]) : std::nullopt;
    if (!id)
      return type_error(fmt::format("{}[{}]", param, i), "an integer token id");
    if (*id < 0 || *id > std::numeric_limits<int32_t>::max())
      return api_error::bad_request(
        fmt::format("'{}[{}]' must be a non-negative token id, got {}", param, i, *id),
        std::string(param));
    out.push_back(int32_t(*id));
  }
  return {};
}

/// `prompt`: a string, an array of token ids, or a one-element array of
/// either (batches of several prompts are not supported).
check read_prompt(const json& body, generate_request& req) {
  auto v = find(body, "prompt");
  if (!v)
    return api_error::bad_request("'prompt' is required", "prompt",
                                  "missing_required_parameter");
  if (v->is_string()) {
    req.prompt = v->get<std::string>();
    return {};
  }
  if (!v->is_array())
    return type_error("prompt", "a string, an array of token ids or an array of one string");
  if (v->empty())
    return api_error::bad_request("'prompt' must not be an empty array", "prompt");
  if ((*v)[0].is_number())
    return read_token_ids(*v, "prompt", req.prompt_ids);
  if (v->size() > 1)
    return unsupported("prompt", "more than one prompt per request");
  const auto& only = (*v)[0];
  if (only.is_string()) {
    req.prompt = only.get<std::string>();
    return {};
  }
  if (only.is_array()) {
    if (only.empty())
      return api_error::bad_request("'prompt[0]' must not be empty", "prompt");
    return read_token_ids(only, "prompt[0]", req.prompt_ids);
  }
  return type_error("prompt", "a string, an array of token ids or an array of one string");
}

/// `stop`: a string or an array of at most 4 strings; empty strings are
/// dropped (they would match everywhere).
check read_stop(const json& body, generate_request& req) {
  auto v = find(body, "stop");
  if (!v)
    return {};
  if (v->is_string()) {
    if (!v->get_ref<const std::string&>().empty())
      req.stop.push_back(v->get<std::string>());
    return {};
  }
  if (!v->is_array())
    return type_error("stop", "a string or an array of strings");
  if (v->size() > 4)
    return api_error::bad_request(
      fmt::format("'stop' may hold at most 4 sequences, got {}", v->size()), "stop");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      return type_error(fmt::format("stop[{}]", i), "a string");
    if (!(*v)[i].get_ref<const std::string&>().empty())
      req.stop.push_back((*v)[i].get<std::string>());
  }
  return {};
}

/// Fields of OpenAI's API that change the answer in ways Metronome does not
/// implement: a 400 naming them beats a silently different answer.
check reject_unsupported(api_kind kind, const json& body) {
  std::optional<int64_t> n;
  if (auto err = read_int(body, "n", n, std::numeric_limits<int64_t>::min(),
                          std::numeric_limits<int64_t>::max()))
    return err;
  if (n && *n != 1)
    return api_error::bad_request(fmt::format("'n' must be 1 (one choice per request), got {}", *n),
                                  "n", "unsupported_value");
  if (kind == api_kind::chat) {
    if (auto v = find(body, "tools"); v && !(v->is_array() && v->empty()))
      return unsupported("tools", "tool calling");
    if (auto v = find(body, "functions"); v && !(v->is_array() && v->empty()))
      return unsupported("functions", "function calling");
    // Without tools, "none" and "auto" choose no call; anything else asks for one.
    for (const char* key : {"tool_choice", "function_call"})
      if (auto v = find(body, key); v && !(v->is_string() && (*v == "none" || *v == "auto")))
        return unsupported(key, fmt::format("'{}' other than \"none\" or \"auto\"", key));
    if (auto v = find(body, "modalities")) {
      if (!v->is_array())
        return type_error("modalities", "an array of strings");
      for (const auto& m : *v)
        if (m != "text")
          return unsupported("modalities", "an output modality other than text");
    }
    if (find(body, "audio"))
      return unsupported("audio", "audio output");
  } else {
    bool echo = false;
    if (auto err = read_bool(body, "echo", echo))
      return err;
    if (echo)
      return unsupported("echo", "'echo'");
    std::optional<int64_t> best_of;
    if (auto err = read_int(body, "best_of", best_of, 1, 20))
      return err;
    if (best_of && *best_of != 1)
      return unsupported("best_of", "'best_of' > 1");
    if (auto v = find(body, "suffix")) {
      if (!v->is_string())
        return type_error("suffix", "a string");
      if (!v->get_ref<const std::string&>().empty())
        return unsupported("suffix", "'suffix'");
    }
  }
  if (auto v = find(body, "response_format")) {
    if (!v->is_object())
      return type_error("response_format", "an object");
    auto t = v->find("type");
    if (t == v->end() || !t->is_string() || *t != "text")
      return unsupported("response_format", "a response_format other than text");
  }
  if (auto v = find(body, "logit_bias")) {
    if (!v->is_object())
      return type_error("logit_bias", "an object mapping token ids to biases");
    if (!v->empty())
      return unsupported("logit_bias", "'logit_bias'");
  }
  // vLLM's constrained-decoding extensions, which its clients send.
  for (const char* key :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"})
    if (find(body, key))
      return unsupported(key, fmt::format("constrained decoding ('{}')", key));
  return {};
}

/// The sampling parameters shared by both endpoints.
check read_sampling(api_kind kind, const json& body, sampling_params& p) {
  if (auto err = read_float(body, "temperature", p.temperature, 0.0, 2.0))
    return err;
  if (auto err = read_float(body, "top_p", p.top_p, 0.0, 1.0, true))
    return err;
  if (auto err = read_float(body, "min_p", p.min_p, 0.0, 1.0))
    return err;
  if (auto err = read_float(body, "frequency_penalty", p.frequency_penalty, -2.0, 2.0))
    return err;
  if (auto err = read_float(body, "presence_penalty", p.presence_penalty, -2.0, 2.0))
    return err;
  if (auto err = read_float(body, "repetition_penalty", p.repetition_penalty, 0.0, 2.0, true))
    return err;
  std::optional<int64_t> top_k;
  if (auto err = read_int(body, "top_k", top_k, -1, std::numeric_limits<int32_t>::max()))
    return err;
  if (top_k)
    p.top_k = int32_t(*top_k);
  // Any 64-bit integer is a seed; negative ones wrap (vLLM accepts int64).
  if (auto v = find(body, "seed")) {
    if (!v->is_number())
      return type_error("seed", "an integer");
    if (v->is_number_unsigned())
      p.seed = v->get<uint64_t>();
    else if (auto i = as_integer(*v))
      p.seed = uint64_t(*i);
    else
      return type_error("seed", "an integer");
  }
  // max_completion_tokens (the current name) wins over max_tokens.
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> max_completion_tokens;
  constexpr int64_t max_int = std::numeric_limits<int32_t>::max();
  if (auto err = read_int(body, "max_tokens", max_tokens, 1, max_int))
    return err;
  if (kind == api_kind::chat) {
    if (auto err = read_int(body, "max_completion_tokens", max_completion_tokens, 1, max_int))
      return err;
  }
  if (max_completion_tokens)
    p.max_tokens = int32_t(*max_completion_tokens);
  else if (max_tokens)
    p.max_tokens = int32_t(*max_tokens);
  else if (kind == api_kind::chat)
    p.max_tokens = 0; // unset: the engine runs to the end of the context
  else
    p.max_tokens = 16; // OpenAI's default for /v1/completions
  if (auto err = read_bool(body, "ignore_eos", p.ignore_eos))
    return err;
  // Chat: logprobs (a boolean) and top_logprobs (alternatives, which need
  // logprobs); completions: logprobs is the number of alternatives. Both up
  // to max_logprobs (OpenAI caps completions at 5; vLLM, like us, at 20).
  if (kind == api_kind::chat) {
    bool logprobs = false;
    if (auto err = read_bool(body, "logprobs", logprobs))
      return err;
    std::optional<int64_t> top;
    if (auto err = read_int(body, "top_logprobs", top, 0, max_logprobs))
      return err;
    if (top && *top > 0 && !logprobs)
      return api_error::bad_request("top_logprobs requires logprobs to be true", "top_logprobs",
                                    "invalid_value");
    if (logprobs)
      p.logprobs = int32_t(top.value_or(0));
  } else {
    std::optional<int64_t> logprobs;
    if (auto err = read_int(body, "logprobs", logprobs, 0, max_logprobs))
      return err;
    if (logprobs)
      p.logprobs = int32_t(*logprobs);
  }
  if (auto v = find(body, "stop_token_ids")) {
    if (!v->is_array())
      return type_error("stop_token_ids", "an array of token ids");
    if (auto err = read_token_ids(*v, "stop_token_ids", p.stop_token_ids))
      return err;
  }
  // The engine's own check, as a backstop for anything missed above (0 is
  // the engine's "unset" for max_tokens, which validate() does not know).
  auto checked = p;
  checked.max_tokens = std::max(checked.max_tokens, 1);
  if (auto problem = checked.validate(); !problem.empty()) {
    auto colon = problem.find(':');
    return api_error::bad_request(problem,
                                  colon == std::string::npos ? "" : problem.substr(0, colon));
  }
  return {};
}

/// `model`, when given and not empty, must name the served model.
check read_model(const json& body, const parse_defaults& defaults) {
  auto v = find(body, "model");
  if (!v)
    return {};
  if (!v->is_string())
    return type_error("model", "a string");
  const auto& name = v->get_ref<const std::string&>();
  if (!name.empty() && name != defaults.model_name)
    return api_error{404, fmt::format("The model `{}` does not exist.", name),
                     "invalid_request_error", "model", "model_not_found"};
  return {};
}

} // namespace

// -- public functions -------------------------------------------------------------------

std::expected<json, api_error> parse_json(std::string_view text, int max_depth) {
  if (nesting_depth(text, max_depth) > max_depth)
    return std::unexpected(api_error::bad_request(
      fmt::format("request body nests deeper than {} levels", max_depth), "", "invalid_json"));
  auto result = read_json(text);
  if (!result)
    return std::unexpected(
      api_error::bad_request("request body is not valid JSON", "", "invalid_json"));
  return std::move(*result);
}

std::expected<openai_request, api_error> parse_openai_request(api_kind kind, const json& body,
                                                              const parse_defaults& defaults,
                                                              request_source source) {
  try {
    if (!body.is_object())
      return std::unexpected(api_error::bad_request("request body must be a JSON object", "",
                                                    "invalid_type"));
    openai_request out;
    out.kind = kind;
    auto& req = out.request;
    req.chat = kind == api_kind::chat;
    req.request_class = req.chat ? "chat" : "completion";
    req.timeout = defaults.timeout;

    out.model = defaults.model_name;
    METRONOME_TRY(read_model(body, defaults));

    if (source == request_source::http) {
      METRONOME_TRY(read_bool(body, "stream", out.stream));
      if (auto v = find(body, "stream_options")) {
        if (!v->is_object())
          return std::unexpected(type_error("stream_options", "an object"));
        if (!out.stream)
          return std::unexpected(api_error::bad_request(
            "'stream_options' is only allowed when 'stream' is true", "stream_options"));
        METRONOME_TRY(read_bool(*v, "include_usage", out.include_usage));
      }
    }

    if (kind == api_kind::chat) {
      METRONOME_TRY(read_messages(body, req));
      METRONOME_TRY(read_bool(body, "add_generation_prompt", req.add_generation_prompt));
    } else {
      METRONOME_TRY(read_prompt(body, req));
    }
    METRONOME_TRY(reject_unsupported(kind, body));
    METRONOME_TRY(read_stop(body, req));
    METRONOME_TRY(read_sampling(kind, body, req.params));
    METRONOME_TRY(read_bool(body, "skip_special_tokens", req.skip_special_tokens));
    std::optional<int64_t> max_context;
    METRONOME_TRY(read_int(body, "max_context_length", max_context, 1,
                           std::numeric_limits<int32_t>::max()));
    if (max_context)
      req.max_context = int32_t(*max_context);
    return out;
  } catch (const std::exception& e) {
    // nlohmann throws only on misuse (a type mismatch the checks missed):
    // answer 400 rather than let an exception reach the io thread.
    return std::unexpected(
      api_error::bad_request(fmt::format("malformed request: {}", e.what()), "", "invalid_value"));
  }
}

std::string kv_strategy_header(const std::string& strategy, std::string_view kv_overflow) {
  if (strategy.find(";dtype=fp8_e5m2") == std::string::npos)
    return strategy;
  if (kv_overflow.empty())
    return strategy + ";kv=fp8_e5m2";
  const bool full = kv_overflow == "rematerialized" || kv_overflow == "cooldown";
  return strategy + (full ? ";kv=bf16" : ";kv=fp8_e5m2") + ";kv_overflow="
         + std::string(kv_overflow);
}

std::optional<api_error> read_kv_headers(std::string_view mode, std::string_view no_batch,
                                        kv_strategy configured, generate_request& req) {
  if (!mode.empty()) {
    auto m = parse_kv_strategy(mode);
    if (!m)
      return api_error::bad_request(
        fmt::format("X-KV-Cache-Mode: '{}' is not paged or bucketed", mode), "", "invalid_value");
    if (*m == kv_strategy::bucketed && configured != kv_strategy::bucketed)
      return api_error::bad_request("X-KV-Cache-Mode: bucketed is not allowed: the server's "
                                    "engine.kv_strategy is paged",
                                    "", "invalid_value");
    req.kv_mode = m;
  }
  if (!no_batch.empty()) {
    if (no_batch == "true" || no_batch == "1")
      req.no_batch = true;
    else if (no_batch == "false" || no_batch == "0")
      req.no_batch = false;
    else
      return api_error::bad_request(
        fmt::format("X-No-Batch: '{}' is not true or false", no_batch), "", "invalid_value");
  }
  return std::nullopt;
}

std::expected<tokenize_request, api_error> parse_tokenize_body(std::string_view body,
                                                               const parse_defaults& defaults) {
  auto j = parse_json(body);
  if (!j)
    return std::unexpected(std::move(j.error()));
  json_disposer dispose{*j};
  try {
    if (!j->is_object())
      return std::unexpected(api_error::bad_request("request body must be a JSON object", "",
                                                    "invalid_type"));
    METRONOME_TRY(read_model(*j, defaults));
    tokenize_request out;
    const json* prompt = find(*j, "prompt");
    const json* messages = find(*j, "messages");
    if (prompt && messages)
      return std::unexpected(api_error::bad_request(
        "give either 'prompt' or 'messages', not both", "messages", "invalid_value"));
    if (!prompt && !messages)
      return std::unexpected(api_error::bad_request("'prompt' or 'messages' is required",
                                                    "prompt", "missing_required_parameter"));
    if (prompt) {
      if (!prompt->is_string())
        return std::unexpected(type_error("prompt", "a string"));
      out.prompt = prompt->get<std::string>();
    } else {
      generate_request req;
      METRONOME_TRY(read_messages(*j, req));
      out.chat = true;
      out.messages = std::move(req.messages);
      out.add_special_tokens = false;
      METRONOME_TRY(read_bool(*j, "add_generation_prompt", out.add_generation_prompt));
    }
    METRONOME_TRY(read_bool(*j, "add_special_tokens", out.add_special_tokens));
    return out;
  } catch (const std::exception& e) {
    return std::unexpected(
      api_error::bad_request(fmt::format("malformed request: {}", e.what()), "", "invalid_value"));
  }
}

std::expected<detokenize_request, api_error>
parse_detokenize_body(std::string_view body, const parse_defaults& defaults) {
  auto j = parse_json(body);
  if (!j)
    return std::unexpected(std::move(j.error()));
  json_disposer dispose{*j};
  try {
    if (!j->is_object())
      return std::unexpected(api_error::bad_request("request body must be a JSON object", "",
                                                    "invalid_type"));
    METRONOME_TRY(read_model(*j, defaults));
    auto v = find(*j, "tokens");
    if (!v)
      return std::unexpected(
        api_error::bad_request("'tokens' is required", "tokens", "missing_required_parameter"));
    if (!v->is_array())
      return std::unexpected(type_error("tokens", "an array of token ids"));
    detokenize_request out;
    METRONOME_TRY(read_token_ids(*v, "tokens", out.tokens));
    return out;
  } catch (const std::exception& e) {
    return std::unexpected(
      api_error::bad_request(fmt::format("malformed request: {}", e.what()), "", "invalid_value"));
  }
}

std::expected<openai_request, api_error>
parse_openai_body(api_kind kind, std::string_view body, const parse_defaults& defaults) {
  auto j = parse_json(body);
  if (!j)
    return std::unexpected(std::move(j.error()));
  json_disposer dispose{*j};
  return parse_openai_request(kind, *j, defaults);
}

} // namespace metronome::net
