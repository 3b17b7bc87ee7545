#pragma once
// A running http_server on 127.0.0.1 in front of the fake engine, for the
// HTTP and WebSocket tests.

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "caf/all.hpp"

#include "net/http_server.hpp"
#include "tests/net/fake_engine.hpp"
#include "tests/net/test_client.hpp"

namespace metronome::test {

/// Polls `pred` until it holds or `limit` passes; returns its last value.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline)
      return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

class ServerTest : public ::testing::Test {
protected:
  ServerTest() {
    cfg_.set("scheduler.max-threads", 2);
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    stats_ = std::make_shared<fake_stats>();
    eng_ = make_fake_engine(*sys_, stats_);
    opts_.host = "127.0.0.1";
    opts_.port = 0;
    opts_.io_threads = 2;
    opts_.max_body_bytes = 64 * 1024;
    opts_.max_ws_message_bytes = 32 * 1024;
    opts_.max_streams_per_connection = 4;
    opts_.request_timeout = std::chrono::seconds(30);
    opts_.retry_after = std::chrono::seconds(7);
  }

  ~ServerTest() override {
    stop();
    caf::anon_send_exit(eng_.frontend, caf::exit_reason::kill);
  }

  /// Starts the server with opts_ (tests may change opts_ first).
  void start() {
    server_ = std::make_unique<net::http_server>(*sys_, eng_, opts_);
    port_ = server_->start();
  }

  void stop() {
    if (server_)
      server_->stop();
  }

  void SetUp() override {
    start();
  }

  /// A chat body whose last user message is `script` (see fake_engine.hpp).
  static std::string chat_body(const std::string& script, nlohmann::json extra = {}) {
    nlohmann::json j = {{"model", "fake-model"},
                        {"messages", {{{"role", "user"}, {"content", script}}}}};
    for (auto& [k, v] : extra.items())
      j[k] = v;
    return j.dump();
  }

  static std::string completion_body(const std::string& script, nlohmann::json extra = {}) {
    nlohmann::json j = {{"model", "fake-model"}, {"prompt", script}};
    for (auto& [k, v] : extra.items())
      j[k] = v;
    return j.dump();
  }

  watchdog watchdog_{std::chrono::seconds(60)};
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::shared_ptr<fake_stats> stats_;
  engine eng_;
  net::server_options opts_;
  std::unique_ptr<net::http_server> server_;
  uint16_t port_ = 0;
};

} // namespace metronome::test
