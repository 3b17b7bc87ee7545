// No input crashes the edge: random bytes and mutated valid requests go
// through the JSON/OpenAI parser, the WebSocket message parser, and over
// loopback into the running server; afterwards the server still answers.
// Seeds are fixed, so a failure reproduces.

#include <random>

#include <gtest/gtest.h>

#include "net/openai_request.hpp"
#include "net/ws_protocol.hpp"
#include "tests/net/server_fixture.hpp"

namespace metronome::test {
namespace {

using json = nlohmann::json;

std::string random_bytes(std::mt19937_64& rng, size_t max_len) {
  std::uniform_int_distribution<size_t> len{0, max_len};
  std::uniform_int_distribution<int> byte{0, 255};
  std::string s(len(rng), '\0');
  for (auto& c : s)
    c = char(byte(rng));
  return s;
}

/// Flips, inserts, deletes and duplicates bytes of `s`; favours JSON syntax.
std::string mutate(std::mt19937_64& rng, std::string s) {
  static const std::string alphabet = "{}[]\":,0123456789.-+eEtruefalsnl \\u\xff\x80\r\n";
  std::uniform_int_distribution<int> ops{1, 6};
  int n = ops(rng);
  for (int i = 0; i < n; ++i) {
    if (s.empty()) {
      s += alphabet[rng() % alphabet.size()];
      continue;
    }
    auto pos = rng() % s.size();
    switch (rng() % 4) {
      case 0:
        s[pos] = alphabet[rng() % alphabet.size()];
        break;
      case 1:
        s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
        break;
      case 2:
        s.erase(pos, 1 + rng() % 8);
        break;
      default:
        s.insert(pos, s.substr(pos, 1 + rng() % 16));
        break;
    }
  }
  return s;
}

const std::vector<std::string>& seeds() {
  static const std::vector<std::string> corpus = {
    R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stream":true,"stream_options":{"include_usage":true}})",
    R"({"messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"user","content":"b"}],"stop":["x","y"],"max_tokens":5,"seed":-3})",
    R"({"prompt":[1,2,3],"max_tokens":4,"top_k":5,"min_p":0.1,"n":1,"logprobs":null})",
    R"({"prompt":["text"],"echo":false,"best_of":1,"stop":"\n","frequency_penalty":-1.5})",
    R"({"type":"chat","id":"a","messages":[{"role":"user","content":"hi"}]})",
    R"({"type":"cancel","id":"a"})",
    R"({"type":"ping"})",
  };
  return corpus;
}

TEST(Fuzz, ParsersNeverThrowOnRandomBytes) {
  std::mt19937_64 rng{20240601};
  net::parse_defaults d;
  d.model_name = "m";
  for (int i = 0; i < 20000; ++i) {
    auto input = random_bytes(rng, 256);
    EXPECT_NO_THROW({
      auto r = net::parse_openai_body(i % 2 ? net::api_kind::chat : net::api_kind::completion,
                                      input, d);
      if (!r)
        (void)r.error().body();
      (void)net::parse_ws_message(input, d);
    });
  }
}

TEST(Fuzz, ParsersNeverThrowOnMutatedRequests) {
  std::mt19937_64 rng{7};
  net::parse_defaults d;
  d.model_name = "m";
  size_t accepted = 0;
  for (int i = 0; i < 50000; ++i) {
    const auto& seed = seeds()[rng() % seeds().size()];
    auto input = mutate(rng, seed);
    for (auto kind : {net::api_kind::chat, net::api_kind::completion}) {
      std::expected<net::openai_request, net::api_error> r;
      ASSERT_NO_THROW(r = net::parse_openai_body(kind, input, d)) << input;
      if (r) {
        ++accepted;
        // What the parser accepts, the engine accepts too (0 max_tokens is
        // the engine's "unset").
        auto p = r->request.params;
        EXPECT_GE(p.max_tokens, 0);
        p.max_tokens = std::max(p.max_tokens, 1);
        EXPECT_EQ(p.validate(), "") << input;
      } else {
        EXPECT_GE(r.error().status, 400);
        EXPECT_TRUE(json::accept(r.error().body()));
      }
    }
    ASSERT_NO_THROW((void)net::parse_ws_message(input, d)) << input;
  }
  // The mutations must not all be rejected, or the accepted path is untested.
  EXPECT_GT(accepted, 1000u);
}

TEST(Fuzz, DeeplyNestedInputs) {
  net::parse_defaults d;
  d.model_name = "m";
  for (auto open : {"[", "{\"a\":", "[{\"b\":["}) {
    std::string s;
    while (s.size() < 1'000'000)
      s += open;
    EXPECT_FALSE(net::parse_openai_body(net::api_kind::chat, s, d).has_value());
    EXPECT_TRUE(std::holds_alternative<net::ws_bad>(net::parse_ws_message(s, d)));
  }
}

class FuzzServer : public ServerTest {};

TEST_F(FuzzServer, RandomBytesOverTheWire) {
  std::mt19937_64 rng{99};
  for (int i = 0; i < 300; ++i) {
    http_client c{port_};
    std::string bytes;
    switch (i % 3) {
      case 0:
        bytes = random_bytes(rng, 2048);
        break;
      case 1: {
        // A valid request line and headers, then garbage or a mutated body.
        auto body = mutate(rng, seeds()[rng() % 4]);
        bytes = fmt::format("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                            body.size(), body);
        break;
      }
      default: {
        auto body = seeds()[rng() % 4];
        auto req = fmt::format("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                               "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                               body.size(), body);
        bytes = mutate(rng, req);
        break;
      }
    }
    boost::system::error_code ec;
    asio::write(c.socket(), asio::buffer(bytes), ec);
    // Half the time hang up at once, half the time read what comes back.
    if (i % 2 == 0) {
      c.reset();
      continue;
    }
    c.socket().shutdown(tcp::socket::shutdown_send, ec);
    std::string sink;
    auto n = asio::read(c.socket(), asio::dynamic_buffer(sink), ec);
    (void)n;
  }
  // Still serving, and every request that reached the engine ended.
  http_client c{port_};
  EXPECT_EQ(c.request(http::verb::get, "/health").result_int(), 200u);
  auto res = c.request(http::verb::post, "/v1/completions", completion_body("echo alive"));
  EXPECT_EQ(json::parse(res.body())["choices"][0]["text"], "alive ");
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
}

TEST_F(FuzzServer, RandomWebSocketMessages) {
  std::mt19937_64 rng{5};
  ws_client ws{port_};
  int sent = 0;
  for (int i = 0; i < 500; ++i) {
    if (i % 2) {
      ws.send_binary(random_bytes(rng, 512));
    } else {
      // Text frames must be UTF-8 (RFC 6455 8.1; Beast fails the connection
      // with 1007 otherwise): keep the mutations ASCII.
      auto text = mutate(rng, seeds()[4 + rng() % 3]);
      for (auto& ch : text)
        if (static_cast<unsigned char>(ch) >= 0x80)
          ch = '?';
      ws.send_text(text);
    }
    ++sent;
  }
  // Every message gets at least one event back; the connection still works.
  ws.send({{"type", "ping"}, {"id", "end"}});
  for (int guard = 0; guard < 100000; ++guard) {
    auto e = ws.receive();
    if (e["type"] == "pong" && e.value("id", "") == "end")
      break;
  }
  ws.close();
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
}

} // namespace
} // namespace metronome::test
