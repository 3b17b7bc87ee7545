// The route table and path decoding.

#include <gtest/gtest.h>

#include "net/http_routes.hpp"

namespace metronome::net {
namespace {

namespace http = boost::beast::http;

TEST(HttpRoutes, Table) {
  EXPECT_EQ(route_of("/v1/chat/completions"), route::chat);
  EXPECT_EQ(route_of("/v1/completions"), route::completions);
  EXPECT_EQ(route_of("/v1/models"), route::models);
  EXPECT_EQ(route_of("/v1/models/x"), route::model);
  EXPECT_EQ(route_of("/v1/models/"), route::unknown);
  EXPECT_EQ(route_of("/health"), route::health);
  EXPECT_EQ(route_of("/metrics"), route::metrics);
  EXPECT_EQ(route_of("/v1/ws"), route::websocket);
  EXPECT_EQ(route_of("/"), route::page);
  EXPECT_EQ(method_of(route::page), boost::beast::http::verb::get);
  EXPECT_EQ(route_of("/v1/chat/completions/"), route::unknown);
  EXPECT_EQ(route_of(""), route::unknown);
  EXPECT_EQ(method_of(route::chat), http::verb::post);
  EXPECT_EQ(method_of(route::completions), http::verb::post);
  EXPECT_EQ(method_of(route::models), http::verb::get);
  EXPECT_EQ(method_of(route::websocket), http::verb::get);
}

TEST(HttpRoutes, TokenizerAndVersionRoutes) {
  EXPECT_EQ(route_of("/tokenize"), route::tokenize);
  EXPECT_EQ(route_of("/detokenize"), route::detokenize);
  EXPECT_EQ(route_of("/version"), route::version);
  EXPECT_EQ(route_of("/v1/tokenize"), route::unknown);
  EXPECT_EQ(method_of(route::tokenize), http::verb::post);
  EXPECT_EQ(method_of(route::detokenize), http::verb::post);
  EXPECT_EQ(method_of(route::version), http::verb::get);
  EXPECT_TRUE(takes_json_body(route::tokenize));
  EXPECT_FALSE(takes_json_body(route::version));
}

TEST(HttpRoutes, RequestIdValidation) {
  EXPECT_TRUE(valid_request_id("a"));
  EXPECT_TRUE(valid_request_id("0b8c2f1e-7d2a-4c7e-9a53-5f3e1d2c4b6a"));
  EXPECT_TRUE(valid_request_id("~!@#$%^&*()_+{}|:\"<>?[]\\;',./`"));
  EXPECT_TRUE(valid_request_id(std::string(max_request_id_bytes, 'x')));
  EXPECT_FALSE(valid_request_id(""));
  EXPECT_FALSE(valid_request_id(std::string(max_request_id_bytes + 1, 'x')));
  EXPECT_FALSE(valid_request_id("a b"));
  EXPECT_FALSE(valid_request_id("a\tb"));
  EXPECT_FALSE(valid_request_id("a\nb"));
  EXPECT_FALSE(valid_request_id(std::string_view("a\0b", 3)));
  EXPECT_FALSE(valid_request_id("a\x7f"));
  EXPECT_FALSE(valid_request_id("caf\xC3\xA9"));
}

TEST(HttpRoutes, PercentDecoding) {
  EXPECT_EQ(percent_decode("meta-llama%2FLlama-3-8B"), "meta-llama/Llama-3-8B");
  EXPECT_EQ(percent_decode("a%20b%2fc"), "a b/c");
  // Invalid or truncated escapes stay as they are.
  EXPECT_EQ(percent_decode("100%"), "100%");
  EXPECT_EQ(percent_decode("%zz%4"), "%zz%4");
  EXPECT_EQ(percent_decode(""), "");
}

} // namespace
} // namespace metronome::net
