// The key table of metronome.yaml. Each entry binds a dotted path to a field
// of server_config through an accessor lambda, and carries its range, so
// parsing, range checks, error wording and printing are written once per
// kind of value rather than once per key.

#include "config/config_schema.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "config/config_scalar.hpp"
#include "model/fault_injection.hpp"

namespace metronome {

namespace {

// -- error wording -----------------------------------------------------------------

/// The offending text as messages show it: quoted, cut after 60 characters.
std::string quoted(std::string_view text) {
  constexpr size_t max_shown = 60;
  if (text.size() > max_shown)
    return yaml_quote(text.substr(0, max_shown)) + "...";
  return yaml_quote(text);
}

// -- range descriptions ------------------------------------------------------------

struct real_range {
  double lo;
  double hi;
  bool lo_open = false;
  bool hi_open = false;

  bool contains(double x) const {
    if (!std::isfinite(x))
      return false;
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }

  std::string describe() const {
    return std::string(lo_open ? "(" : "[") + print_real(lo) + ", " + print_real(hi)
           + (hi_open ? ")" : "]");
  }
};

bool is_fault_injection(std::string_view text) {
  return fault_injection::parse(text).has_value();
}

bool is_device(std::string_view text) {
  return device_spec::parse(text).has_value();
}

bool is_cuda_device(std::string_view text) {
  const auto d = device_spec::parse(text);
  return d && d->kind == device_kind::cuda;
}

bool is_listen_address(std::string_view text) {
  return text.empty() || parse_host_port(text).has_value();
}

bool is_connect_address(std::string_view text) {
  if (text.empty())
    return true;
  auto hp = parse_host_port(text);
  return hp && hp->port != 0;
}

bool is_power_of_two(int64_t x) {
  return x > 0 && (x & (x - 1)) == 0;
}



// -- key builders ------------------------------------------------------------------

template <class T>
using field_t = std::remove_cvref_t<T>;

std::string type_problem(const std::string& allowed, std::string_view text) {
  return "expected " + allowed + ", got " + quoted(text);
}

std::string range_problem(const std::string& allowed, std::string_view text) {
  return quoted(text) + " is out of range, expected " + allowed;
}

template <class Access>
config_key integer_key(std::string path, Access access, int64_t lo, int64_t hi,
                       std::string doc, std::string note = {}) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::integer;
  k.metavar = "INT";
  k.allowed = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"
              + (note.empty() ? "" : " (" + note + ")");
  k.doc = std::move(doc);
  k.set = [access, lo, hi, allowed = k.allowed](server_config& c,
                                                std::string_view text) -> std::string {
    auto v = parse_integer(text);
    if (!v) {
      const auto digits = text.starts_with('-') || text.starts_with('+') ? text.substr(1) : text;
      if (digits.size() > 1 && digits.front() == '0'
          && digits.find_first_not_of("0123456789") == std::string_view::npos)
        return quoted(text) + " has a leading zero (octal to some YAML readers): write it without";
      return type_problem(allowed, text);
    }
    if (*v < lo || *v > hi)
      return range_problem(allowed, text);
    auto& field = access(c);
    field = static_cast<field_t<decltype(field)>>(*v);
    return {};
  };
  k.get = [access](const server_config& c) { return std::to_string(access(c)); };
  return k;
}

template <class Access>
config_key power_of_two_key(std::string path, Access access, int64_t lo, int64_t hi,
                            std::string doc) {
  auto k = integer_key(std::move(path), access, lo, hi, std::move(doc), "a power of two");
  auto base = k.set;
  k.set = [base, lo, hi](server_config& c, std::string_view text) -> std::string {
    if (auto v = parse_integer(text); v && *v >= lo && *v <= hi && !is_power_of_two(*v))
      return quoted(text) + " is not a power of two";
    return base(c, text);
  };
  return k;
}

template <class Access>
config_key real_key(std::string path, Access access, real_range range, std::string doc) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::real;
  k.metavar = "FLOAT";
  k.allowed = "a number in " + range.describe();
  k.doc = std::move(doc);
  k.set = [access, range, allowed = k.allowed](server_config& c,
                                               std::string_view text) -> std::string {
    auto v = parse_real(text);
    if (!v)
      return type_problem(allowed, text);
    if (!range.contains(*v))
      return range_problem(allowed, text);
    access(c) = *v;
    return {};
  };
  k.get = [access](const server_config& c) { return print_real(access(c)); };
  return k;
}

template <class Access>
config_key bytes_key(std::string path, Access access, int64_t lo, int64_t hi, std::string doc) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::bytes;
  k.metavar = "SIZE";
  k.allowed = "a byte count in [" + print_bytes(lo) + ", " + print_bytes(hi)
              + "] (an integer, or with a unit: KiB, MiB, GiB, KB, MB, GB)";
  k.doc = std::move(doc);
  k.set = [access, lo, hi, allowed = k.allowed](server_config& c,
                                                std::string_view text) -> std::string {
    auto v = parse_bytes(text);
    if (!v)
      return type_problem(allowed, text);
    if (*v < lo || *v > hi)
      return range_problem(allowed, text);
    access(c) = *v;
    return {};
  };
  k.get = [access](const server_config& c) { return print_bytes(access(c)); };
  return k;
}

template <class Access>
config_key boolean_key(std::string path, Access access, std::string doc) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::boolean;
  k.metavar = "BOOL";
  k.allowed = "true or false";
  k.doc = std::move(doc);
  k.set = [access, allowed = k.allowed](server_config& c,
                                        std::string_view text) -> std::string {
    auto v = parse_boolean(text);
    if (!v)
      return type_problem(allowed, text);
    access(c) = *v;
    return {};
  };
  k.get = [access](const server_config& c) -> std::string {
    return access(c) ? "true" : "false";
  };
  return k;
}

/// A free-form string; `check` (optional) refuses bad syntax; `metavar`
/// names it in the command line's help.
template <class Access>
config_key text_key(std::string path, Access access, std::string doc,
                    std::string allowed = "a string", bool (*check)(std::string_view) = nullptr,
                    std::string metavar = "TEXT") {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::text;
  k.metavar = std::move(metavar);
  k.allowed = std::move(allowed);
  k.doc = std::move(doc);
  k.set = [access, check, allowed = k.allowed](server_config& c,
                                               std::string_view text) -> std::string {
    if (check && !check(text))
      return type_problem(allowed, text);
    access(c) = std::string(text);
    return {};
  };
  k.get = [access](const server_config& c) { return yaml_quote(access(c)); };
  return k;
}

/// A file or folder: a string the help names PATH.
template <class Access>
config_key path_key(std::string path, Access access, std::string doc) {
  return text_key(std::move(path), access, std::move(doc), "a string", nullptr, "PATH");
}

/// model.chat_template: "", one of chat_template_names, or a file's path,
/// told from a mistyped name by a '/' or a '.' in it. Whether the file
/// exists and holds a template Metronome recognises is checked at start-up
/// (chat_template::from_file), where the model's tokens are known.
template <class Access>
config_key chat_template_key(std::string path, Access access, std::string doc) {
  std::string names;
  for (auto name : chat_template_names)
    names += std::string(names.empty() ? "" : ", ") + std::string(name);
  auto k = text_key(
    std::move(path), access, std::move(doc),
    "\"\", " + names + ", or the path of a Jinja template file (with a / or a . in it)",
    [](std::string_view text) {
      return text.empty() || is_chat_template_name(text)
             || text.find_first_of("/.") != std::string_view::npos;
    });
  k.metavar = "{";
  for (auto name : chat_template_names)
    k.metavar += std::string(k.metavar.size() > 1 ? "," : "") + std::string(name);
  k.metavar += "}|PATH";
  return k;
}

/// One of the values in `all`, spelled as to_string() spells them.
template <class Enum, size_t N, class Access>
config_key choice_key(std::string path, Access access, std::array<Enum, N> all,
                      std::string doc) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::choice;
  k.allowed = "one of ";
  for (size_t i = 0; i < N; ++i) {
    if (i > 0)
      k.allowed += ", ";
    auto name = to_string(all[i]);
    k.allowed += name.empty() ? std::string("\"\"") : std::string(name);
  }
  // The help lists the names; the empty one (a default) is not typed.
  for (auto x : all) {
    auto name = to_string(x);
    if (name.empty())
      continue;
    k.metavar += k.metavar.empty() ? "{" : ",";
    k.metavar += name;
  }
  k.metavar += "}";
  k.doc = std::move(doc);
  k.set = [access, all, allowed = k.allowed](server_config& c,
                                             std::string_view text) -> std::string {
    for (auto x : all) {
      if (to_string(x) == text) {
        access(c) = x;
        return {};
      }
    }
    return type_problem(allowed, text);
  };
  k.get = [access](const server_config& c) -> std::string {
    auto name = to_string(access(c));
    return name.empty() ? yaml_quote(name) : std::string(name);
  };
  return k;
}

template <class Access>
config_key device_key(std::string path, Access access, std::string doc) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::text;
  k.metavar = "cpu|cuda:N";
  k.allowed = "cpu or cuda:N (N a GPU ordinal in [0, 63])";
  k.doc = std::move(doc);
  k.set = [access, allowed = k.allowed](server_config& c,
                                        std::string_view text) -> std::string {
    auto v = device_spec::parse(text);
    if (!v)
      return type_problem(allowed, text);
    access(c) = *v;
    return {};
  };
  k.get = [access](const server_config& c) { return access(c).to_string(); };
  return k;
}

/// A list of strings; `check` refuses a bad item, `item` names one in the
/// help ("ORIGIN"). The command line's text is split at commas; an empty
/// text is the empty list.
template <class Access>
config_key list_key(std::string path, Access access, std::string doc, std::string allowed,
                    bool (*check)(std::string_view), std::string_view item) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::list;
  k.metavar = std::string(item) + ",...";
  k.allowed = "a list of " + allowed;
  k.doc = std::move(doc);
  k.set_list = [access, check, allowed](server_config& c,
                                        const std::vector<std::string>& items) -> std::string {
    for (const auto& item : items)
      if (!check(item))
        return "expected " + allowed + ", got " + quoted(item);
    access(c) = items;
    return {};
  };
  k.set = [set_list = k.set_list](server_config& c, std::string_view text) -> std::string {
    std::vector<std::string> items;
    while (!text.empty()) {
      auto comma = text.find(',');
      items.emplace_back(text.substr(0, comma));
      text.remove_prefix(comma == std::string_view::npos ? text.size() : comma + 1);
    }
    return set_list(c, items);
  };
  k.get = [access](const server_config& c) {
    std::string out = "[";
    for (const auto& item : access(c)) {
      if (out.size() > 1)
        out += ", ";
      out += yaml_quote(item);
    }
    return out + "]";
  };
  return k;
}

/// batching.token_groups: parse_token_bounds's syntax, its own problem
/// named in the message.
template <class Access>
config_key token_bounds_key(std::string path, Access access, std::string doc) {
  config_key k;
  k.path = std::move(path);
  k.kind = value_kind::text;
  k.metavar = "N,N,...";
  k.allowed = "\"\" (off) or increasing token counts in [1, 1048576] separated by commas, "
              "at most 8 (\"32,128\")";
  k.doc = std::move(doc);
  k.set = [access](server_config& c, std::string_view text) -> std::string {
    std::string problem;
    const auto bounds = parse_token_bounds(text, &problem);
    if (!bounds)
      return problem;
    // Stored as written back: "32,128" whatever the spaces.
    std::string canonical;
    for (auto b : *bounds)
      canonical += (canonical.empty() ? "" : ",") + std::to_string(b);
    access(c) = canonical;
    return {};
  };
  k.get = [access](const server_config& c) { return yaml_quote(access(c)); };
  return k;
}

// -- item syntax of the access keys ---------------------------------------------------

/// Visible ASCII without commas (the list separator of the command line):
/// what fits in an Authorization header, a subprotocol or a query string.
bool valid_api_key(std::string_view key) {
  if (key.empty() || key.size() > 512)
    return false;
  return std::all_of(key.begin(), key.end(), [](char c) { return c > ' ' && c < 0x7f && c != ','; });
}

/// "*", or scheme://host[:port] with scheme http or https and nothing after.
bool valid_origin(std::string_view origin) {
  if (origin == "*")
    return true;
  std::string_view rest;
  if (origin.starts_with("http://"))
    rest = origin.substr(7);
  else if (origin.starts_with("https://"))
    rest = origin.substr(8);
  else
    return false;
  std::string_view host = rest;
  if (rest.starts_with('[')) { // [IPv6]
    auto close = rest.find(']');
    if (close == std::string_view::npos)
      return false;
    host = rest.substr(1, close - 1);
    rest.remove_prefix(close + 1);
  } else {
    auto colon = rest.find(':');
    host = rest.substr(0, colon);
    rest.remove_prefix(colon == std::string_view::npos ? rest.size() : colon);
  }
  if (!rest.empty()) {
    if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6)
      return false;
    if (rest.substr(1).find_first_not_of("0123456789") != std::string_view::npos)
      return false;
  }
  return valid_host(host);
}

/// "*", a host name or address, or ".domain" (the domain and its subdomains).
bool valid_allowed_host(std::string_view host) {
  if (host == "*")
    return true;
  if (host.starts_with('.'))
    host.remove_prefix(1);
  return valid_host(host);
}

// Binds a key to `cfg.<member path>`; works on const and mutable configs.
#define METRONOME_FIELD(member) [](auto& cfg) -> auto& { return cfg.member; }

constexpr int64_t kib = int64_t{1} << 10;
constexpr int64_t gib = int64_t{1} << 30;
constexpr int64_t max_ms = 3'600'000;   // one hour
constexpr double max_s = 7.0 * 86400.0; // one week

std::vector<config_key> make_keys() {
  std::vector<config_key> keys;
  auto add = [&](config_key k) { keys.push_back(std::move(k)); };

  // server
  add(text_key(
    "server.host", METRONOME_FIELD(server.host),
    "Address to listen on; 0.0.0.0 or :: listens on every interface.",
    "an IPv4 or IPv6 address or a host name", [](std::string_view s) { return valid_host(s); },
    "HOST"));
  add(integer_key("server.port", METRONOME_FIELD(server.port), 0, 65535,
                  "TCP port; 0 picks a free port (printed at start)."));
  add(bytes_key("server.max_body_bytes", METRONOME_FIELD(server.max_body_bytes), kib, gib,
                "Largest HTTP request body; larger ones get 413."));
  add(integer_key("server.max_queued_requests", METRONOME_FIELD(server.max_queued_requests), 1,
                  1'000'000, "Requests waiting for admission; more get 429."));
  add(integer_key("server.retry_after_s", METRONOME_FIELD(server.retry_after_s), 1, 3600,
                  "Retry-After header (seconds) sent with 429."));
  add(real_key("server.request_timeout_s", METRONOME_FIELD(server.request_timeout_s),
               {0, max_s, true, false},
               "A request unfinished after this many seconds is cancelled with an error."));
  add(bytes_key("server.max_ws_message_bytes", METRONOME_FIELD(server.max_ws_message_bytes),
                kib, gib, "Largest WebSocket message; larger ones close the connection (1009)."));
  add(integer_key("server.io_threads", METRONOME_FIELD(server.io_threads), 1, 256,
                  "Threads running the network event loop."));
  add(integer_key("server.max_concurrent_streams_per_connection",
                  METRONOME_FIELD(server.max_concurrent_streams_per_connection), 1, 4096,
                  "Requests in flight at once on one WebSocket connection."));
  add(integer_key("server.max_connections", METRONOME_FIELD(server.max_connections), 0,
                  10'000'000,
                  "Open client connections at once; more get 503 with Retry-After. 0 sizes it "
                  "from the file descriptor limit.",
                  "0 = from RLIMIT_NOFILE"));
  add(real_key("server.idle_timeout_s", METRONOME_FIELD(server.idle_timeout_s),
               {0, max_s, true, false},
               "A keep-alive connection idle this long is closed; also the WebSocket ping "
               "timeout."));
  add(real_key("server.header_timeout_s", METRONOME_FIELD(server.header_timeout_s),
               {0, max_s, true, false},
               "Seconds a client has to send a whole request once its first byte arrived."));
  add(real_key("server.write_timeout_s", METRONOME_FIELD(server.write_timeout_s),
               {0, max_s, true, false},
               "An HTTP response write (an SSE stream, say) making no progress this long closes "
               "the connection."));
  add(real_key("server.drain_timeout_s", METRONOME_FIELD(server.drain_timeout_s), {0, max_s},
               "On SIGTERM/SIGINT, how long running requests may finish before they are ended "
               "with an error."));
  add(list_key("server.api_keys", METRONOME_FIELD(server.api_keys),
               "Keys clients must send as Authorization: Bearer KEY (every route but /health); "
               "empty and no other key source: no key needed.",
               "API keys (visible ASCII, no spaces or commas)", &valid_api_key, "KEY"));
  add(path_key("server.api_keys_file", METRONOME_FIELD(server.api_keys_file),
               "File with more API keys, one per line ('#' comments); empty: none."));
  add(boolean_key("server.metrics_without_key", METRONOME_FIELD(server.metrics_without_key),
                  "GET /metrics answers without an API key."));
  add(boolean_key("server.chat_page", METRONOME_FIELD(server.chat_page),
                  "GET / serves the chat page (no API key needed to load it; false: 404)."));
  add(list_key("server.allowed_origins", METRONOME_FIELD(server.allowed_origins),
               "Browser origins allowed besides the server's own (CORS and /v1/ws); \"*\" = any.",
               "origins (http[s]://host[:port], or \"*\")", &valid_origin, "ORIGIN"));
  add(list_key("server.allowed_hosts", METRONOME_FIELD(server.allowed_hosts),
               "Host header names accepted besides the bound address and localhost; "
               "\".example.com\" = the domain and its subdomains, \"*\" = any.",
               "host names (a name, .domain, or \"*\")", &valid_allowed_host, "HOST"));
  add(path_key("server.tls.cert_file", METRONOME_FIELD(server.tls.cert_file),
               "PEM certificate chain: serve HTTPS and wss:// (with server.tls.key_file)."));
  add(path_key("server.tls.key_file", METRONOME_FIELD(server.tls.key_file),
               "PEM private key of server.tls.cert_file."));

  // model
  add(path_key("model.path", METRONOME_FIELD(model.path),
               "Hugging Face model folder; empty serves the model that ships with Metronome."));
  add(device_key("model.device", METRONOME_FIELD(model.device),
                 "Where the model runs: cpu or cuda:N."));
  add(list_key("model.devices", METRONOME_FIELD(model.devices),
               "Data parallel: one replica per device listed (a device listed k times holds k "
               "replicas, each with 1/k of engine.gpu_memory_fraction); empty: "
               "model.data_parallel replicas on model.device.",
               "devices (cpu or cuda:N)", &is_device, "DEVICE"));
  add(integer_key("model.data_parallel", METRONOME_FIELD(model.data_parallel), 0, 64,
                  "Data parallel: replicas of the model behind one router, each with its own "
                  "scheduler, executor and KV cache; 0: none here, only workers serve "
                  "(workers.listen)."));
  add(text_key("model.served_model_name", METRONOME_FIELD(model.served_model_name),
               "Model name in the API (`model` field, /v1/models); empty = the folder name."));
  add(chat_template_key(
    "model.chat_template", METRONOME_FIELD(model.chat_template),
    "Chat prompt format: a name, or a Jinja template file (Hugging Face's chat_template) "
    "whose format Metronome recognises; empty = the template in tokenizer_config.json."));
  add(integer_key("model.max_model_len", METRONOME_FIELD(model.max_model_len), 0, 1 << 24,
                  "Longest prompt + output in tokens; 0 = the model's context length."));
  add(integer_key("model.tensor_parallel", METRONOME_FIELD(model.tensor_parallel), 1, 8,
                  "Tensor parallel: CUDA devices one model is split over (attention heads and "
                  "MLP features), from model.device on, or model.tensor_parallel_devices."));
  add(list_key("model.tensor_parallel_devices", METRONOME_FIELD(model.tensor_parallel_devices),
               "Tensor parallel: the ranks' devices, one per rank (a device listed k times "
               "holds k ranks, each with 1/k of engine.gpu_memory_fraction; peer collective "
               "only); empty: consecutive devices from model.device.",
               "CUDA devices (cuda:N)", &is_cuda_device, "DEVICE"));
  add(text_key("model.tensor_parallel_collective",
               METRONOME_FIELD(model.tensor_parallel_collective),
               "Tensor parallel: how the ranks sum their partial outputs: auto (peer when "
               "every rank is on one device, else nccl), nccl, or peer (direct reads between "
               "devices with peer access).",
               "one of auto, nccl, peer",
               [](std::string_view t) { return t == "auto" || t == "nccl" || t == "peer"; },
               "{auto,nccl,peer}"));
  add(choice_key("model.quantize", METRONOME_FIELD(model.quantize),
                 std::array{weight_quantization::none, weight_quantization::int4},
                 "Quantize a float checkpoint at load: none, or int4 (every q/k/v/o/gate/up/"
                 "down projection rounded to nearest into the AWQ layout, group 128; "
                 "embeddings, norms and LM head stay float)."));

  // engine
  add(integer_key("engine.max_batch_size", METRONOME_FIELD(engine.max_batch_size), 1, 4096,
                  "Cap on sequences running at once."));
  add(integer_key("engine.max_num_batched_tokens",
                  METRONOME_FIELD(engine.max_num_batched_tokens), 1, 1 << 20,
                  "Token budget of one step (decode tokens + prefill chunks)."));
  add(power_of_two_key("engine.page_size", METRONOME_FIELD(engine.page_size), 1, 1024,
                       "Tokens per KV-cache page."));
  add(integer_key("engine.kv_cache_tokens", METRONOME_FIELD(engine.kv_cache_tokens), 0,
                  int64_t{1} << 32,
                  "KV-cache capacity in tokens, rounded down to whole pages; 0 = size it from "
                  "free memory."));
  add(real_key("engine.gpu_memory_fraction", METRONOME_FIELD(engine.gpu_memory_fraction),
               {0, 1, true, false}, "Share of GPU memory Metronome may use."));
  add(boolean_key("engine.cuda_graphs", METRONOME_FIELD(engine.cuda_graphs),
                  "Replay decode steps and small mixed steps as CUDA graphs (ignored on cpu)."));
  add(boolean_key("engine.prefix_caching", METRONOME_FIELD(engine.prefix_caching),
                  "Reuse the KV pages of identical prompt prefixes (whole pages) across "
                  "requests; kept least recently used until their pages are needed."));
  add(choice_key("engine.kv_cache_dtype", METRONOME_FIELD(engine.kv_cache_dtype),
                 std::array{kv_cache_dtype_kind::bf16, kv_cache_dtype_kind::fp8,
                            kv_cache_dtype_kind::fp8_e5m2},
                 "Element type of the KV cache: bf16, fp8 (e4m3 with a scale per token row: "
                 "about half the memory and half the bytes a decode step reads; CUDA only), or "
                 "fp8_e5m2 (e5m2 with a scale per kv head and 256-token window, its overflows "
                 "supervised: engine.kv_overflow; only the CPU engine's reference, which keeps "
                 "an fp32 cache and saves no memory)."));
  add(integer_key("engine.kv_overflow.max_rematerializations",
                  METRONOME_FIELD(engine.kv_overflow.max_rematerializations), 0, 1'000'000,
                  "fp8_e5m2: requests whose KV overflowed that are recomputed in bf16 within "
                  "engine.kv_overflow.window_s; the next overflow starts a cool-down."));
  add(real_key("engine.kv_overflow.window_s", METRONOME_FIELD(engine.kv_overflow.window_s),
               {0, max_s, true, false},
               "fp8_e5m2: sliding window over which re-materialisations are counted."));
  add(real_key("engine.kv_overflow.cooldown_s", METRONOME_FIELD(engine.kv_overflow.cooldown_s),
               {0, max_s, true, false},
               "fp8_e5m2: how long new requests get bf16 KV once the re-materialisation budget "
               "is spent; then fp8_e5m2 again."));
  add(choice_key("engine.kv_strategy", METRONOME_FIELD(engine.kv_strategy),
                 std::array{kv_strategy_kind::paged, kv_strategy_kind::bucketed},
                 "How KV pages are granted: paged (on demand; a request may be preempted when "
                 "they run out) or bucketed (reserved buckets for a request's whole life, "
                 "overflow into pages)."));
  add(integer_key("engine.kv_bucket_min_tokens", METRONOME_FIELD(engine.kv_bucket_min_tokens), 16,
                  1 << 24,
                  "bucketed: the smallest bucket, in tokens; the classes are 1, 2, 4 and 8 times "
                  "it (up to the context length)."));
  add(integer_key("engine.kv_buckets_per_size", METRONOME_FIELD(engine.kv_buckets_per_size), 1,
                  1 << 20,
                  "bucketed: buckets of each class (fewer when the KV cache cannot back them "
                  "all)."));
  add(choice_key("engine.policy", METRONOME_FIELD(engine.policy),
                 std::array{scheduling_policy::fcfs, scheduling_policy::ladb,
                            scheduling_policy::srpt, scheduling_policy::ladb_literal},
                 "Scheduling policy at start; supervisors may switch it at run time."));
  add(integer_key("engine.step_timeout_ms", METRONOME_FIELD(engine.step_timeout_ms), 1, max_ms,
                  "A step running longer fails the executor, which is restarted."));
  add(integer_key("engine.prefill_chunk_tokens", METRONOME_FIELD(engine.prefill_chunk_tokens),
                  0, 1 << 20,
                  "Largest prefill chunk of one sequence per step; 0 = the step's token budget."));
  add(text_key("engine.fault_injection", METRONOME_FIELD(engine.fault_injection),
               "Tests and drills only: every executor's step N + 1 throws, hangs, or reports a "
               "device error or a lost device (docs/reliability.md).",
               "none, or throw_after:N, hang_after:N, device_error_after:N or "
               "device_lost_after:N",
               &is_fault_injection));

  // batching
  add(integer_key("batching.max_batch_size", METRONOME_FIELD(batching.max_batch_size), 1, 4096,
                  "Largest cohort LADB admits together."));
  add(integer_key("batching.min_batch_size", METRONOME_FIELD(batching.min_batch_size), 1, 4096,
                  "A cohort is dispatched once it has this many requests."));
  add(integer_key("batching.target_latency_ms", METRONOME_FIELD(batching.target_latency_ms), 1,
                  max_ms, "Longest step carrying prompt work (ladb; never below its decodes')."));
  add(real_key("batching.step_time_factor", METRONOME_FIELD(batching.step_time_factor), {0, 100},
               "ladb: a step with prompt work may take this many times its decodes alone; "
               "0 = no limit."));
  add(real_key("batching.long_step_share", METRONOME_FIELD(batching.long_step_share), {0, 1},
               "ladb: share of steps that may run a prompt past the step limit."));
  add(real_key("batching.variance_tolerance", METRONOME_FIELD(batching.variance_tolerance),
               {0, 1}, "Predictions within this relative distance share a cohort."));
  add(integer_key("batching.min_hold_ms", METRONOME_FIELD(batching.min_hold_ms), 0, 60'000,
                  "Shortest hold window while a cohort fills."));
  add(integer_key("batching.max_hold_ms", METRONOME_FIELD(batching.max_hold_ms), 0, 60'000,
                  "Longest hold window while a cohort fills."));
  add(token_bounds_key("batching.token_groups", METRONOME_FIELD(batching.token_groups),
                       "Token-aware grouping (any policy): bounds of generated tokens; requests "
                       "of lower groups are admitted and decoded first, the highest preempted "
                       "first. \"\" = off."));

  // predictor
  add(path_key("predictor.model_path", METRONOME_FIELD(predictor.model_path),
               "Must be empty: the predictor starts from the cold-start rule."));
  add(integer_key("predictor.warmup_steps", METRONOME_FIELD(predictor.warmup_steps), 0,
                  1'000'000, "Completed requests before the learned model replaces the rule."));
  add(integer_key("predictor.update_interval_ms",
                  METRONOME_FIELD(predictor.update_interval_ms), 1, max_ms,
                  "How often the learned model is refitted."));
  add(real_key("predictor.max_steps_factor", METRONOME_FIELD(predictor.max_steps_factor),
               {1, 100}, "max_decode_steps = prediction x this; past it a request is re-classified."));
  add(real_key("predictor.cold_start_slope", METRONOME_FIELD(predictor.cold_start_slope),
               {0, 1000}, "Cold start: predicted steps = prompt_tokens x slope + intercept."));
  add(real_key("predictor.cold_start_intercept",
               METRONOME_FIELD(predictor.cold_start_intercept), {0, 1e6},
               "Cold start intercept (steps)."));

  // router
  add(choice_key("router.queue_strategy", METRONOME_FIELD(router.queue_strategy),
                 std::array{queue_strategy_kind::priority_by_remaining_steps,
                            queue_strategy_kind::fcfs},
                 "Order in which admitted requests are released."));
  add(integer_key("router.timeout_ms", METRONOME_FIELD(router.timeout_ms), 1, max_ms,
                  "A request waiting this long gets the fallback policy."));
  add(choice_key("router.fallback_policy", METRONOME_FIELD(router.fallback_policy),
                 std::array{fallback_policy_kind::immediate_dispatch, fallback_policy_kind::wait},
                 "What happens to a request past router.timeout_ms."));
  add(integer_key("router.srpt_promote_after_ms",
                  METRONOME_FIELD(router.srpt_promote_after_ms), 0, max_ms,
                  "srpt: a request waiting this long is moved to the front."));

  // supervisor
  add(boolean_key("supervisor.drift.enabled", METRONOME_FIELD(supervisor.drift.enabled),
                  "Run the drift supervisor."));
  add(real_key("supervisor.drift.window_s", METRONOME_FIELD(supervisor.drift.window_s),
               {0, max_s, true, false}, "Rolling window of predicted vs actual steps."));
  add(real_key("supervisor.drift.error_threshold",
               METRONOME_FIELD(supervisor.drift.error_threshold), {0, 10, true, false},
               "Mean relative error above which predictions count as drifting."));
  add(real_key("supervisor.drift.sustain_s", METRONOME_FIELD(supervisor.drift.sustain_s),
               {0, max_s}, "Drift lasting this long disables LADB."));
  add(real_key("supervisor.drift.disable_s", METRONOME_FIELD(supervisor.drift.disable_s),
               {0, max_s, true, false}, "How long LADB stays disabled (fcfs runs instead)."));
  add(integer_key("supervisor.drift.min_samples", METRONOME_FIELD(supervisor.drift.min_samples),
                  1, 1'000'000, "Completed requests in the window before drift is judged."));
  add(integer_key("supervisor.executor.max_restarts",
                  METRONOME_FIELD(supervisor.executor.max_restarts), 0, 1000,
                  "Executor restarts allowed within the window; one more failure leaves "
                  "the engine degraded."));
  add(real_key("supervisor.executor.restart_window_s",
               METRONOME_FIELD(supervisor.executor.restart_window_s), {0, max_s, true, false},
               "Window over which executor restarts are counted."));

  // logging
  add(choice_key("logging.level", METRONOME_FIELD(logging.level),
                 std::array{log_level::trace, log_level::debug, log_level::info, log_level::warn,
                            log_level::error},
                 "Log verbosity."));
  add(choice_key("logging.format", METRONOME_FIELD(logging.format),
                 std::array{log_format_kind::text, log_format_kind::json},
                 "Log lines on stderr as text, or as one JSON object a line."));
  add(real_key("logging.stats_interval_s", METRONOME_FIELD(logging.stats_interval_s),
               {0, 86400.0},
               "Seconds between the engine's stats lines while it has work; 0 = none."));
  add(boolean_key("logging.log_prompts", METRONOME_FIELD(logging.log_prompts),
                  "Access lines also carry each request's prompt and output (off: never "
                  "logged)."));
  add(path_key("logging.step_trace", METRONOME_FIELD(logging.step_trace),
               "CSV file of every engine step: its shape, predicted and measured time "
               "(wall and device); empty = none."));

  // workers
  add(text_key("workers.listen", METRONOME_FIELD(workers.listen),
               "serve: HOST:PORT where `metronome worker` processes attach as replicas (no "
               "authentication: a loopback or private address); empty: no workers.",
               "HOST:PORT or empty", &is_listen_address, "ADDRESS"));
  add(text_key("workers.connect", METRONOME_FIELD(workers.connect),
               "worker: the front end's workers.listen address.", "HOST:PORT or empty",
               &is_connect_address, "ADDRESS"));
  add(text_key("workers.name", METRONOME_FIELD(workers.name),
               "worker: its name in the front end's logs and /metrics; empty: HOSTNAME:PID."));
  add(integer_key("workers.max_workers", METRONOME_FIELD(workers.max_workers), 1, 64,
                  "serve: workers attached at most (each a replica in /metrics)."));
  add(integer_key("workers.heartbeat_ms", METRONOME_FIELD(workers.heartbeat_ms), 10, max_ms,
                  "How often the front end asks each worker for its load, and CAF's "
                  "connection heartbeat (set the same on both sides)."));
  add(integer_key("workers.timeout_ms", METRONOME_FIELD(workers.timeout_ms), 20, max_ms,
                  "A worker silent this long is removed; its requests re-run elsewhere when "
                  "nothing was streamed yet, else fail."));
  return keys;
}

#undef METRONOME_FIELD

} // namespace

// -- public functions --------------------------------------------------------------

const std::vector<config_key>& config_keys() {
  static const std::vector<config_key> keys = make_keys();
  return keys;
}

const config_key* find_config_key(std::string_view path) {
  for (const auto& k : config_keys())
    if (k.path == path)
      return &k;
  return nullptr;
}

bool is_config_section(std::string_view path) {
  if (path.empty())
    return true;
  for (const auto& k : config_keys())
    if (k.path.size() > path.size() && k.path.starts_with(path) && k.path[path.size()] == '.')
      return true;
  return false;
}

std::string default_text(const config_key& key) {
  static const server_config defaults;
  // get() writes YAML (quoted strings, [lists]); read it back as a YAML
  // reader would.
  const YAML::Node node = YAML::Load(key.get(defaults));
  if (!node.IsSequence())
    return node.IsScalar() ? node.Scalar() : std::string();
  std::string out;
  for (const auto& item : node)
    out += (out.empty() ? "" : ",") + item.Scalar();
  return out;
}

std::vector<std::string> config_children(std::string_view section) {
  std::vector<std::string> out;
  auto prefix = section.empty() ? std::string() : std::string(section) + ".";
  for (const auto& k : config_keys()) {
    if (!k.path.starts_with(prefix))
      continue;
    auto rest = std::string_view(k.path).substr(prefix.size());
    auto name = std::string(rest.substr(0, rest.find('.')));
    if (std::find(out.begin(), out.end(), name) == out.end())
      out.push_back(std::move(name));
  }
  return out;
}

} // namespace metronome
