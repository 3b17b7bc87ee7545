#include "net/http_routes.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "net/api_error.hpp"
#include "net/openai_response.hpp"

namespace metronome::net {

namespace http = boost::beast::http;

namespace {

constexpr std::string_view models_prefix = "/v1/models/";

info_response json_response(http::status status, unsigned version, const nlohmann::json& body) {
  info_response res{status, version};
  res.set(http::field::content_type, "application/json");
  res.body() = dump_json(body);
  return res;
}

info_response error_response(const api_error& err, unsigned version) {
  info_response res{static_cast<http::status>(err.status), version};
  res.set(http::field::content_type, "application/json");
  res.body() = err.body();
  return res;
}

} // namespace

route route_of(std::string_view path) {
  if (path == "/")
    return route::page;
  if (path == "/v1/chat/completions")
    return route::chat;
  if (path == "/v1/completions")
    return route::completions;
  if (path == "/tokenize")
    return route::tokenize;
  if (path == "/detokenize")
    return route::detokenize;
  if (path == "/v1/models")
    return route::models;
  if (path.starts_with(models_prefix) && path.size() > models_prefix.size())
    return route::model;
  if (path == "/health")
    return route::health;
  if (path == "/metrics")
    return route::metrics;
  if (path == "/version")
    return route::version;
  if (path == "/v1/ws")
    return route::websocket;
  return route::unknown;
}

http::verb method_of(route r) {
  return takes_json_body(r) ? http::verb::post : http::verb::get;
}

bool takes_json_body(route r) {
  return r == route::chat || r == route::completions || r == route::tokenize
         || r == route::detokenize;
}

nlohmann::json version_body() {
#ifdef METRONOME_HAVE_CUDA
  constexpr bool cuda = true;
#else
  constexpr bool cuda = false;
#endif
#ifdef METRONOME_BUILD_TYPE
  const char* build_type = METRONOME_BUILD_TYPE;
#else
  const char* build_type = "";
#endif
#if defined(__clang__)
  const std::string compiler = fmt::format("clang {}", __clang_version__);
#elif defined(__GNUC__)
  const std::string compiler = fmt::format("gcc {}", __VERSION__);
#else
  const std::string compiler = "unknown";
#endif
  return {{"version", METRONOME_VERSION},
          {"cuda", cuda},
          {"build_type", build_type},
          {"compiler", compiler}};
}

bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > max_request_id_bytes)
    return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int hi = hex(s[i + 1]);
      int lo = hex(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += char(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

info_response answer_info_route(route r, std::string_view path, unsigned version,
                                const server_context& ctx) {
  const auto* status = ctx.eng.status.get();
  switch (r) {
    case route::models:
      return json_response(http::status::ok, version,
                           models_body(ctx.model_name, ctx.started,
                                       status ? status->max_model_len : 0,
                                       status ? status->model_description : std::string()));
    case route::model: {
      auto name = percent_decode(path.substr(models_prefix.size()));
      if (name != ctx.model_name)
        return error_response(api_error{404, fmt::format("The model `{}` does not exist.", name),
                                        "invalid_request_error", "model", "model_not_found"},
                              version);
      return json_response(http::status::ok, version,
                           model_body(ctx.model_name, ctx.started,
                                      status ? status->max_model_len : 0,
                                      status ? status->model_description : std::string()));
    }
    case route::health: {
      // Draining first: a load balancer must stop sending here even while
      // the engine is still healthy.
      bool ok = ctx.ready() && !ctx.draining.load();
      const char* state = ctx.draining.load()                   ? "draining"
                          : ok                                  ? "ok"
                          : (status && status->degraded.load()) ? "degraded"
                                                                : "loading";
      nlohmann::json body{{"status", state}};
      if (std::string_view(state) == "degraded") {
        // Why, for the operator: the executor's failures (docs/reliability.md).
        auto why = status->reason();
        body["reason"] = why.empty() ? "the executor keeps failing" : why;
      }
      return json_response(ok ? http::status::ok : http::status::service_unavailable, version,
                           body);
    }
    case route::version:
      return json_response(http::status::ok, version, version_body());
    case route::metrics: {
      info_response res{http::status::ok, version};
      try {
        if (!ctx.eng.metrics || !status)
          throw std::runtime_error("the engine has no metrics");
        res.body() = render_metrics(ctx.eng);
        res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      } catch (const std::exception& e) {
        res.result(http::status::internal_server_error);
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = fmt::format("metrics unavailable: {}\n", e.what());
      }
      return res;
    }
    default:
      break;
  }
  return error_response(api_error::not_found(fmt::format("no route for {}", path)), version);
}

info_response method_not_allowed_response(route r, std::string_view method,
                                          std::string_view path, unsigned version) {
  auto res = error_response(api_error::method_not_allowed(method, path), version);
  res.set(http::field::allow, http::to_string(method_of(r)));
  return res;
}

info_response upgrade_required_response(unsigned version) {
  auto res = error_response(api_error{426, "/v1/ws speaks WebSocket only",
                                      "invalid_request_error", "", "upgrade_required"},
                            version);
  res.set(http::field::upgrade, "websocket");
  res.set(http::field::connection, "Upgrade");
  return res;
}

} // namespace metronome::net
